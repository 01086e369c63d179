"""The session tools over REST: ``POST /v1/sessions`` and ``/v1/sessions/{id}[/…]``.

The same operations as the MCP tools (:class:`.session_tools.SessionTools`), with JSON
bodies named as the tools' inputs (``cwd``, ``agent``, ``title``, ``userMetadata``,
``prompt``, ``text``, ``wait``) and RFC 9457 problem documents with the same codes.
Reading needs the ``read`` scope, changing the ``write`` scope.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...auth.credentials import Credentials
from ...auth.principal import Scope
from ...errors import ApiError, ErrorCode, invalid_argument
from ...store.events import JsonObject
from ..approval import API_SCOPE
from .event_stream import MEDIA_TYPE, EventStream, resume_after
from .idempotency import HEADER, IdempotencyKeys, checked_key
from .interaction_tools import InteractionTools
from .keyed import KeyedMutations
from .presence_tools import PresenceTools
from .rest import SESSIONS_PATH, HttpAnswer, json_answer, problem
from .session_tools import SessionTools, SessionView, TurnView, request_base
from .tool_inputs import BODY_WORDING, ToolInput
from .tool_models import (
    CreateSession,
    InteractionAnswer,
    NoInput,
    PromptInput,
    interaction_id_of,
    session_id_of,
)
from .tool_outputs import Cancelled, SessionWithLink, Turn, session_object

InputT = TypeVar("InputT", bound=ToolInput)

ONE_SESSION = SESSIONS_PATH + "/{id}"
BODY_MAX = 1 << 20
"""The largest request body taken (1 MiB: a prompt's text fits many times over)."""

Endpoint = Callable[[Request], Awaitable[Response]]
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
ALLOWED = {
    ONE_SESSION: "GET, DELETE",
    **{ONE_SESSION + f"/{action}": "POST" for action in ("prompt", "cancel", "resume", "stop")},
    ONE_SESSION + "/events": "GET",
    ONE_SESSION + "/interactions": "GET",
    ONE_SESSION + "/interactions/{iid}/respond": "POST",
    ONE_SESSION + "/presence": "GET",
}
"""What each path answers: any other method is a 405 problem naming these."""


def session_document(view: SessionView) -> SessionWithLink:
    """A session as ``GET /v1/sessions`` lists it, plus its ``liveViewUrl``."""
    return {**session_object(view.row), "liveViewUrl": view.live_view_url}


def turn_document(session_id: str, turn: TurnView) -> Turn:
    return {"sessionId": session_id, "liveViewUrl": turn.live_view_url, **turn.report.document()}


def _response(answer: HttpAnswer) -> Response:
    return Response(answer.body, answer.status, headers=dict(answer.headers))


class SessionRoutes:
    """The REST routes of the session tools."""

    def __init__(self, tools: SessionTools, stream: EventStream) -> None:
        self.tools = tools
        self.stream = stream
        self.keys = IdempotencyKeys(tools.redis, wait=tools.settings.request_timeout)
        self.mutations = KeyedMutations(tools.redis, tools.settings, self._caller)
        self.asks = InteractionTools(tools)
        self.presence = PresenceTools(tools)

    def routes(self) -> list[Route]:
        """The routes, to go before the catch-all REST route (which answers the rest)."""
        return [
            Route(SESSIONS_PATH, self._guard(self.create), methods=["POST"]),
            Route(ONE_SESSION, self._guard(self.get), methods=["GET"]),
            Route(ONE_SESSION, self._keyed(self.delete), methods=["DELETE"]),
            Route(ONE_SESSION + "/prompt", self._keyed(self.prompt, False), methods=["POST"]),
            Route(ONE_SESSION + "/cancel", self._keyed(self.cancel), methods=["POST"]),
            Route(ONE_SESSION + "/resume", self._keyed(self.resume), methods=["POST"]),
            Route(ONE_SESSION + "/stop", self._keyed(self.stop), methods=["POST"]),
            Route(ONE_SESSION + "/events", self._guard(self.events), methods=["GET"]),
            Route(ONE_SESSION + "/interactions", self._guard(self.interactions), methods=["GET"]),
            Route(
                ONE_SESSION + "/interactions/{iid}/respond",
                self._keyed(self.respond),
                methods=["POST"],
            ),
            Route(ONE_SESSION + "/presence", self._guard(self.present), methods=["GET"]),
            *(
                Route(path, _not_allowed(path, allow), methods=ALL_METHODS)
                for path, allow in ALLOWED.items()
            ),
        ]

    def _guard(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` with its :class:`ApiError`\\ s (and the store's and agents' failures,
        named so by :meth:`SessionTools.guarded`) answered as problem documents."""

        async def guarded(request: Request) -> Response:
            try:
                return await self.tools.guarded(endpoint(request))
            except ApiError as error:
                return _response(problem(error))

        return guarded

    def _keyed(self, endpoint: Endpoint, repeatable: bool = True) -> Endpoint:
        """A mutation: guarded, and run once per ``Idempotency-Key`` (:mod:`.keyed`)."""
        guarded = self._guard(endpoint)
        return self.mutations.keyed(guarded, repeatable=repeatable, long=not repeatable)

    async def _caller(self, request: Request, scope: Scope) -> str:
        credentials = Credentials("http", request.headers.get("authorization"))
        return await self.tools.authorize(credentials, scope)

    def _base(self, request: Request) -> str:
        return request_base(self.tools.settings, str(request.base_url).rstrip("/"))

    # -- endpoints ----------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        tenant = await self._caller(request, Scope.WRITE)
        body = await _body(request, required=True)
        inputs = _inputs(CreateSession, body)
        base = self._base(request)
        key = request.headers.get(HEADER)
        if key is None:
            view = await self.tools.create(tenant, inputs, base)
        else:
            key = checked_key(key)
            claim = await self.keys.claim(tenant, key, body)
            if isinstance(claim, str):  # a retry: the first request's session, nothing run again
                view = await self.tools.view(tenant, claim, base, project=False)
                return self._created(session_document(view))
            async with self.keys.creating(claim):
                view = await self.tools.create(tenant, inputs, base)
            # Settled before the first prompt runs: a retry meanwhile gets the session.
            await self.keys.settle(claim, view.row["sessionId"])
        document = session_document(view)
        if inputs.prompt is not None:
            turn = await self.tools.prompt(tenant, document["id"], inputs.prompt, inputs.wait, base)
            document["turn"] = turn_document(document["id"], turn)
        return self._created(document)

    def _created(self, document: SessionWithLink) -> Response:
        answer = json_answer(201, document)
        answer.headers.append(("Location", f"{SESSIONS_PATH}/{document['id']}"))
        return _response(answer)

    async def get(self, request: Request) -> Response:
        tenant = await self._caller(request, Scope.READ)
        session_id = session_id_of(request.path_params["id"])
        view = await self.tools.view(tenant, session_id, self._base(request), project=False)
        return _response(json_answer(200, session_document(view)))

    async def delete(self, request: Request) -> Response:
        tenant = await self._caller(request, Scope.WRITE)
        await self.tools.delete(tenant, session_id_of(request.path_params["id"]), "")
        return Response(status_code=204, headers={"Cache-Control": "no-store"})

    async def prompt(self, request: Request) -> Response:
        tenant = await self._caller(request, Scope.WRITE)
        session_id = session_id_of(request.path_params["id"])
        inputs = _inputs(PromptInput, await _body(request, required=True))
        base = self._base(request)
        turn = await self.tools.prompt(tenant, session_id, inputs.text, inputs.wait, base)
        status = 200 if turn.report.ended else 202
        return _response(json_answer(status, turn_document(session_id, turn)))

    async def cancel(self, request: Request) -> Response:
        tenant = await self._caller(request, Scope.WRITE)
        session_id = session_id_of(request.path_params["id"])
        _inputs(NoInput, await _body(request, required=False))
        reason = await self.tools.cancel(tenant, session_id)
        cancelled: Cancelled = {"sessionId": session_id, "stopReason": reason}
        return _response(json_answer(200, cancelled))

    async def resume(self, request: Request) -> Response:
        tenant = await self._caller(request, Scope.WRITE)
        session_id = session_id_of(request.path_params["id"])
        _inputs(NoInput, await _body(request, required=False))
        view = await self.tools.resume(tenant, session_id, self._base(request))
        return _response(json_answer(200, session_document(view)))

    async def stop(self, request: Request) -> Response:
        tenant = await self._caller(request, Scope.WRITE)
        session_id = session_id_of(request.path_params["id"])
        _inputs(NoInput, await _body(request, required=False))
        view = await self.tools.stop(tenant, session_id, self._base(request))
        return _response(json_answer(200, session_document(view)))

    async def events(self, request: Request) -> Response:
        tenant = await self._caller(request, Scope.READ)
        session_id = session_id_of(request.path_params["id"])
        last_id = request.headers.get("last-event-id")
        after = resume_after(last_id, request.query_params.get("after"))
        await self.tools.snapshot(tenant, session_id)
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(
            self.stream.frames(tenant, session_id, after), media_type=MEDIA_TYPE, headers=headers
        )

    async def interactions(self, request: Request) -> Response:
        """The session's open and claimed interactions."""
        tenant = await self._caller(request, Scope.READ)
        session_id = session_id_of(request.path_params["id"])
        listed = await self.asks.pending(tenant, session_id)
        return _response(json_answer(200, {"sessionId": session_id, "interactions": listed}))

    async def present(self, request: Request) -> Response:
        """Who is attached to the session now, on every front."""
        tenant = await self._caller(request, Scope.READ)
        session_id = session_id_of(request.path_params["id"])
        return _response(json_answer(200, await self.presence.present(tenant, session_id)))

    async def respond(self, request: Request) -> Response:
        """Answer one (``API_SCOPE``: who may answer, as the ACP methods' rule)."""
        tenant = await self._caller(request, API_SCOPE)
        session_id = session_id_of(request.path_params["id"])
        iid = interaction_id_of(request.path_params["iid"])
        answer = _inputs(InteractionAnswer, await _body(request, required=True))
        done = await self.asks.respond(
            tenant, session_id, iid, answer.response(), answer.expectedRevision
        )
        return _response(json_answer(200, done))


async def _body(request: Request, *, required: bool) -> JsonObject:
    """The request's JSON object body (an empty body is ``{}`` where none is ``required``)."""
    raw = await request.body()
    if len(raw) > BODY_MAX:
        raise invalid_argument(f"the request body is over {BODY_MAX} bytes")
    if not raw.strip():
        if required:
            raise invalid_argument("the request needs a JSON object body")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise invalid_argument("the request body must be JSON") from None
    if not isinstance(body, dict):
        raise invalid_argument("the request body must be a JSON object")
    return body


def _inputs(model: type[InputT], body: JsonObject) -> InputT:
    """A body's members, checked as ``model``'s inputs (a REST body's wording)."""
    return model.parse(body, BODY_WORDING)


def _not_allowed(path: str, allow: str) -> Endpoint:
    async def refuse(request: Request) -> Response:
        error = ApiError(ErrorCode.METHOD_NOT_ALLOWED, f"{path} answers {allow} only")
        return _response(problem(error, allow=allow))

    return refuse
