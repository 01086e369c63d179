"""The session tools over REST: ``POST /v1/sessions`` and ``/v1/sessions/{id}[/…]``.

The same operations as the MCP tools (:class:`.session_tools.SessionTools`), with JSON
bodies named as the tools' inputs (``cwd``, ``agent``, ``title``, ``userMetadata``,
``prompt``, ``text``, ``wait``) and RFC 9457 problem documents with the same codes.
Reading needs the ``read`` scope, changing the ``write`` scope.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...auth.credentials import Credentials
from ...auth.principal import Principal, Scope
from ...auth.roles import Permission
from ...errors import ApiError, ErrorCode, invalid_argument
from ...store.events import JsonObject
from ..approval import API_SCOPE
from .event_stream import MEDIA_TYPE, EventStream, resume_after
from .interaction_tools import InteractionTools
from .keyed import REPLAYED, KeyedMutations
from .presence_tools import PresenceTools
from .rest import SESSIONS_PATH, HttpAnswer, json_answer, problem
from .session_tools import SessionTools, SessionView, TurnView, request_base
from .tool_inputs import BODY_WORDING, ToolInput
from .tool_models import (
    CancelInput,
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
    ONE_SESSION + "/access": "GET, POST",
    ONE_SESSION + "/access/{entry}": "DELETE",
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
        self.mutations = KeyedMutations(tools.redis, tools.settings, self._caller)
        self.asks = InteractionTools(tools)
        self.presence = PresenceTools(tools)

    def routes(self) -> list[Route]:
        """The routes, to go before the catch-all REST route (which answers the rest)."""
        return [
            Route(SESSIONS_PATH, self._guard(self.create), methods=["POST"]),  # keyed within
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
            Route(ONE_SESSION + "/access", self._guard(self.access_list), methods=["GET"]),
            Route(ONE_SESSION + "/access", self._keyed(self.access_grant), methods=["POST"]),
            Route(
                ONE_SESSION + "/access/{entry}", self._keyed(self.access_revoke), methods=["DELETE"]
            ),
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
        return self.mutations.keyed(guarded, repeatable=repeatable)

    async def _caller(self, request: Request, scope: Scope) -> str:
        return await self.tools.authorize(_credentials(request), scope)

    async def _on_session(
        self, request: Request, scope: Scope, permission: Permission
    ) -> tuple[Principal, str]:
        """The caller and the session of the path, if the caller's credential has
        ``scope`` and its roles on the session ``permission`` (``forbidden`` otherwise)."""
        caller = await self.tools.caller(_credentials(request), scope)
        session_id = session_id_of(request.path_params["id"])
        operation = f"{request.method} {request.url.path}"
        await self.tools.require(caller, session_id, permission, operation)
        return caller, session_id

    # -- the session's ACL --------------------------------------------------------------------

    async def access_list(self, request: Request) -> Response:
        """``GET …/access``: the ACL (``session.admin``)."""
        caller, session_id = await self._on_session(request, Scope.READ, Permission.ADMIN)
        tenant = caller.tenant
        await self.tools.live(tenant, session_id)
        view = await self.tools.acl.view(tenant, session_id)
        return _response(json_answer(200, {"sessionId": session_id, **view.to_json()}))

    async def access_grant(self, request: Request) -> Response:
        """``POST …/access``: grant (or replace) a principal's roles (``session.admin``)."""
        caller = await self.tools.caller(_credentials(request), Scope.WRITE)
        session_id = session_id_of(request.path_params["id"])
        await self.tools.require(caller, session_id, Permission.ADMIN, "session_access/grant")
        body = await _body(request, required=True)
        await self.tools.live(caller.tenant, session_id)
        done = await self.tools.acl.grant(caller, {**body, "sessionId": session_id})
        return _response(json_answer(200, done))

    async def access_revoke(self, request: Request) -> Response:
        """``DELETE …/access/{entryId}``: revoke one entry (never the last owner's)."""
        caller = await self.tools.caller(_credentials(request), Scope.WRITE)
        session_id = session_id_of(request.path_params["id"])
        await self.tools.require(caller, session_id, Permission.ADMIN, "session_access/revoke")
        await self.tools.live(caller.tenant, session_id)
        params = {"sessionId": session_id, "entryId": request.path_params["entry"]}
        done = await self.tools.acl.revoke(caller, params)
        await self.tools.agents.fence(caller.tenant, session_id)  # claims it took authority from
        return _response(json_answer(200, done))

    def _base(self, request: Request) -> str:
        return request_base(self.tools.settings, str(request.base_url).rstrip("/"))

    # -- endpoints ----------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        """Create (once per ``Idempotency-Key``: the key settles with the session made,
        before the first prompt runs, so a retry meanwhile gets the session), then run the
        first prompt, if any, for the first request only."""
        caller = await self.tools.caller(_credentials(request), Scope.WRITE)
        tenant = caller.tenant
        inputs = _inputs(CreateSession, await _body(request, required=True))
        base = self._base(request)

        async def made() -> Response:
            view = await self.tools.guarded(self.tools.create(tenant, inputs, base, owner=caller))
            return self._created(session_document(view))

        response = await self.mutations.once(request, made, repeatable=True)
        if inputs.prompt is None or response.status_code != 201 or REPLAYED in response.headers:
            return response
        document: SessionWithLink = json.loads(bytes(response.body))
        turn = await self.tools.prompt(
            tenant, document["id"], inputs.prompt, inputs.wait, base, caller
        )
        document["turn"] = turn_document(document["id"], turn)
        return self._created(document)

    def _created(self, document: SessionWithLink) -> Response:
        answer = json_answer(201, document)
        answer.headers.append(("Location", f"{SESSIONS_PATH}/{document['id']}"))
        return _response(answer)

    async def get(self, request: Request) -> Response:
        caller, session_id = await self._on_session(request, Scope.READ, Permission.READ)
        tenant = caller.tenant
        view = await self.tools.view(tenant, session_id, self._base(request), project=False)
        return _response(json_answer(200, session_document(view)))

    async def delete(self, request: Request) -> Response:
        caller, session_id = await self._on_session(request, Scope.WRITE, Permission.ADMIN)
        tenant = caller.tenant
        await self.tools.delete(tenant, session_id, "")
        return Response(status_code=204, headers={"Cache-Control": "no-store"})

    async def prompt(self, request: Request) -> Response:
        caller, session_id = await self._on_session(request, Scope.WRITE, Permission.WRITE)
        inputs = _inputs(PromptInput, await _body(request, required=True))
        base = self._base(request)
        turn = await self.tools.prompt(
            caller.tenant, session_id, inputs.text, inputs.wait, base, caller
        )
        status = 200 if turn.report.ended else 202
        return _response(json_answer(status, turn_document(session_id, turn)))

    async def cancel(self, request: Request) -> Response:
        """The running turn's, or with ``activityId`` that turn's (a queued one withdrawn
        when the caller is its author; ``stopReason`` null when it was not)."""
        caller = await self.tools.caller(_credentials(request), Scope.WRITE)
        session_id = session_id_of(request.path_params["id"])
        inputs = _inputs(CancelInput, await _body(request, required=False))
        # A queued prompt's author withdraws it with session.write; stopping a turn is control.
        needed = Permission.WRITE if inputs.activityId is not None else Permission.CONTROL
        await self.tools.require(caller, session_id, needed, f"POST {request.url.path}")
        reason = await self.tools.cancel(
            caller.tenant, session_id, inputs.activityId, caller.subject
        )
        cancelled: Cancelled = {"sessionId": session_id, "stopReason": reason}
        return _response(json_answer(200, cancelled))

    async def resume(self, request: Request) -> Response:
        caller, session_id = await self._on_session(request, Scope.WRITE, Permission.READ)
        tenant = caller.tenant
        _inputs(NoInput, await _body(request, required=False))
        view = await self.tools.resume(tenant, session_id, self._base(request))
        return _response(json_answer(200, session_document(view)))

    async def stop(self, request: Request) -> Response:
        caller, session_id = await self._on_session(request, Scope.WRITE, Permission.ADMIN)
        tenant = caller.tenant
        _inputs(NoInput, await _body(request, required=False))
        view = await self.tools.stop(tenant, session_id, self._base(request))
        return _response(json_answer(200, session_document(view)))

    async def events(self, request: Request) -> Response:
        caller, session_id = await self._on_session(request, Scope.READ, Permission.READ)
        tenant = caller.tenant
        last_id = request.headers.get("last-event-id")
        after = resume_after(last_id, request.query_params.get("after"))
        await self.tools.snapshot(tenant, session_id)
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        # A revoke that takes the caller's session.read ends the stream after its event.
        fence = partial(self.tools.acl.lost_read, caller, session_id)
        frames = self.stream.frames(tenant, session_id, after, fence)
        return StreamingResponse(frames, media_type=MEDIA_TYPE, headers=headers)

    async def interactions(self, request: Request) -> Response:
        """The session's open and claimed interactions."""
        caller, session_id = await self._on_session(request, Scope.READ, Permission.READ)
        listed = await self.asks.pending(caller, session_id)
        return _response(json_answer(200, {"sessionId": session_id, "interactions": listed}))

    async def present(self, request: Request) -> Response:
        """Who is attached to the session now, on every front."""
        caller, session_id = await self._on_session(request, Scope.READ, Permission.PRESENCE)
        return _response(json_answer(200, await self.presence.present(caller.tenant, session_id)))

    async def respond(self, request: Request) -> Response:
        """Answer one (``API_SCOPE``: who may answer, as the ACP methods' rule)."""
        caller, session_id = await self._on_session(request, API_SCOPE, Permission.APPROVE)
        iid = interaction_id_of(request.path_params["iid"])
        answer = _inputs(InteractionAnswer, await _body(request, required=True))
        done = await self.asks.respond(
            caller, session_id, iid, answer.response(), answer.expectedRevision
        )
        return _response(json_answer(200, done))


def _credentials(request: Request) -> Credentials:
    return Credentials("http", request.headers.get("authorization"))


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
