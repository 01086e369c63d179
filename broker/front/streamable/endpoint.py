"""``/acp`` on the HTTP port: ACP's Streamable HTTP transport (POST, GET, DELETE).

As the transport RFD routes it: ``POST initialize`` without ``Acp-Connection-Id`` opens
a connection and answers ``200`` with the result and the header; every other POST
answers ``202`` and its response travels on a GET stream; ``GET`` (``Accept:
text/event-stream``) opens the connection-scoped stream, or with ``Acp-Session-Id`` a
session's; ``DELETE`` ends the connection. Refusals: ``400`` (a missing or disagreeing
header, a malformed message), ``401`` (credentials, on every request), ``403`` (a scope the
credential lacks), ``404`` (no such connection for this tenant, or session), ``406``
(GET without ``text/event-stream``), ``409`` (``Last-Event-ID`` past what is kept:
``cursor_gap``; the client reattaches with ``session/load`` or ``session/resume``),
``413`` (a message over ``max_message_bytes``), ``415`` (POST not ``application/json``),
``501`` (a JSON-RPC batch). A WebSocket upgrade here is refused with the WebSocket URL:
WebSocket is served on the ACP port.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from ...auth.authenticator import Authenticator, websocket_token
from ...auth.principal import AuthError, Principal
from ...errors import ErrorCode
from ...errors.store import http_failure
from ...store.http_links import CONNECTION_SCOPE, session_scope
from ...store.log import SessionLog
from ..acp.access import needed_scope
from .scopes import ScopeError, incoming_scope
from .service import ConnectionRefused, StreamableHttp
from .sse import MEDIA_TYPE, ScopeStream, SseResponse

CONNECTION_HEADER = "acp-connection-id"
SESSION_HEADER = "acp-session-id"


class Refused(Exception):
    """A request refused with an HTTP status (and a plain text reason)."""

    def __init__(self, status: int, reason: str, body: Any = None) -> None:
        super().__init__(reason)
        self.status = status
        self.body = body

    def response(self) -> Response:
        if self.body is not None:
            return JSONResponse(self.body, self.status)
        headers = {"WWW-Authenticate": 'Bearer realm="acp-broker"'} if self.status == 401 else {}
        return PlainTextResponse(str(self) + "\n", self.status, headers=headers)


class AcpHttpEndpoint:
    """The ASGI app of ``/acp`` on the HTTP port."""

    def __init__(
        self,
        service: StreamableHttp,
        authenticator: Authenticator,
        log: SessionLog,
        websocket_url: Any,
    ) -> None:
        self.service = service
        self.authenticator = authenticator
        self.log = log
        self.websocket_url = websocket_url
        """Called with the request's Host header: the WebSocket URL a refusal names."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self._answer(request)
        except Refused as refused:
            response = refused.response()
        except Exception as exc:
            failure = http_failure(exc)  # the store away or full: said so, not a bare 500
            if failure is None:
                raise
            response = PlainTextResponse(failure[1] + "\n", failure[0])
        await response(scope, receive, send)

    async def _answer(self, request: Request) -> Any:
        if request.method == "POST":
            return await self._post(request)
        if request.method == "GET":
            return await self._get(request)
        if request.method == "DELETE":
            return await self._delete(request)
        raise Refused(405, "ACP over HTTP takes POST, GET and DELETE")

    async def _principal(self, request: Request) -> Principal:
        token, _ = websocket_token(
            request.headers.get("authorization"), [], request.headers.get("cookie")
        )
        try:
            return await self.authenticator.authenticate(token)
        except AuthError:
            raise Refused(401, "unauthorized") from None

    async def _connection(self, request: Request, principal: Principal) -> str:
        conn_id = request.headers.get(CONNECTION_HEADER)
        if not conn_id:
            raise Refused(400, "the Acp-Connection-Id header is missing")
        record = await self.service.links.load(conn_id)
        if record is None or record.get("tenant") != principal.tenant:
            raise Refused(404, "no such connection (it ended, or expired)")
        return conn_id

    # -- POST -------------------------------------------------------------------------------

    async def _post(self, request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";", 1)[0].strip()
        if content_type.lower() != "application/json":
            raise Refused(415, "a POST to /acp is one JSON-RPC message (application/json)")
        principal = await self._principal(request)
        text = await self._body(request)
        try:
            message = json.loads(text)
        except ValueError:
            error = {"code": -32700, "message": "Parse error"}
            raise Refused(400, "", {"jsonrpc": "2.0", "id": None, "error": error}) from None
        if isinstance(message, list):
            raise Refused(501, "JSON-RPC batches are not taken over HTTP")
        if not isinstance(message, dict):
            error = {"code": -32600, "message": "Invalid Request"}
            raise Refused(400, "", {"jsonrpc": "2.0", "id": None, "error": error})
        method = message.get("method")
        if isinstance(method, str) and not principal.may(needed_scope(method)):
            raise Refused(403, f"the credential may not call {method}")
        if not request.headers.get(CONNECTION_HEADER):
            if method != "initialize" or "id" not in message:
                raise Refused(400, "the Acp-Connection-Id header is missing (initialize first)")
            try:
                conn_id, response = await self.service.initialize(principal, message["id"], text)
            except ConnectionRefused as refused:
                raise Refused(429, str(refused)) from None
            headers = {"Acp-Connection-Id": conn_id} if conn_id else {}
            return Response(response, 200, headers=headers, media_type="application/json")
        conn_id = await self._connection(request, principal)
        try:
            incoming_scope(message, request.headers.get(SESSION_HEADER))
        except ScopeError as exc:
            raise Refused(400, str(exc)) from None
        await self.service.post(conn_id, principal, text)
        return Response(status_code=202)

    async def _body(self, request: Request) -> str:
        limit = self.service.settings.max_message_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise Refused(413, f"a message may be {limit} bytes at most")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise Refused(413, f"a message may be {limit} bytes at most")
        try:
            return body.decode()
        except UnicodeDecodeError:
            raise Refused(400, "the body is not UTF-8") from None

    # -- GET --------------------------------------------------------------------------------

    async def _get(self, request: Request) -> Any:
        if request.headers.get("upgrade", "").lower() == "websocket":
            url = self.websocket_url(request.headers.get("host"))
            raise Refused(400, f"ACP over WebSocket is served at {url}")
        if MEDIA_TYPE not in request.headers.get("accept", ""):
            raise Refused(406, "a GET of /acp opens a stream: Accept text/event-stream")
        principal = await self._principal(request)
        conn_id = await self._connection(request, principal)
        session_id = request.headers.get(SESSION_HEADER)
        scope = CONNECTION_SCOPE
        if session_id:
            found = await self.log.snapshots([(principal.tenant, session_id)])
            if found[0] is None:
                raise Refused(404, "no such session")
            scope = session_scope(session_id)
        after = await self._start(conn_id, scope, request.headers.get("last-event-id"))
        await self.service.links.touch(conn_id)
        stream = ScopeStream(self.service, conn_id, scope, after, principal)
        return SseResponse(stream.frames(), self.service.settings.http_write_timeout)

    async def _start(self, conn_id: str, scope: str, last_event_id: str | None) -> int:
        """Where a stream starts: after ``Last-Event-ID``, else after the last stream's end."""
        links = self.service.links
        _, given = await links.reader(conn_id, scope)
        if last_event_id is None or last_event_id == "":
            record = await links.load(conn_id) or {}
            return int(record.get("p:" + scope) or 0)
        if not last_event_id.isdigit() or len(last_event_id) > 18:
            raise Refused(400, "Last-Event-ID is not an event id of this stream")
        after = int(last_event_id)
        if after > given:
            raise Refused(400, "Last-Event-ID is past the stream's last event")
        first = await links.first(conn_id, scope)
        if after < given and (first is None or first > after + 1):
            error = {
                "error": ErrorCode.CURSOR_GAP.value,
                "message": "events after Last-Event-ID are no longer kept: reattach the "
                "session with session/load or session/resume",
                "oldest": first,
            }
            raise Refused(409, "", error)
        return after

    # -- DELETE -----------------------------------------------------------------------------

    async def _delete(self, request: Request) -> Response:
        principal = await self._principal(request)
        conn_id = await self._connection(request, principal)
        await self.service.delete(conn_id)
        return Response(status_code=202)
