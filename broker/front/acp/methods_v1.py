"""ACP v1 methods as the broker answers them.

Each handler validates its params at the edge, then acts through the store,
the hub and the agent host. Handlers that must order their reply against the
session's events (new, load, resume, set_title) send the reply themselves and
return :data:`DEFERRED`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ... import fastjson
from ...config import AGENT_META_KEY, KIND_META_KEY, SESSION_KINDS, Settings
from ...errors.store import session_lost
from ...protocol.commands import AgentGateway
from ...protocol.jsonrpc import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    JsonObject,
    Request,
    RpcError,
    invalid_params,
    session_not_found,
)
from ...protocol.operations import activity_id
from ...protocol.render import POSITION_META, check_position
from ...protocol.trace import trace_fields, with_trace, without_trace
from ...protocol.turns import client_prompt_id
from ...store.cursors import CursorCodec
from ...store.events import EventType, SessionSnapshot
from ...store.index import SessionIndex, normalize_cwd
from ...store.log import SessionLog, SessionMissing
from ...store.presence import PresenceStore
from ...store.quotas import check_session_quota
from ...store.retry import retrying
from ...store.window import with_window
from ..fanout import FanoutHub
from ..list_changes import ListChanges
from ..pages import PageCache
from ..presence import PresenceBoard
from ..session_acl import SessionAcl, needed_permission
from .access import Access, connection_limit
from .attach import ATTACH_METHODS
from .connection import ClientConnection
from .dispatch import DEFERRED, StepAnswer
from .initialize import AGENTS_META as AGENTS_META
from .initialize import PROTOCOL_VERSION as PROTOCOL_VERSION
from .initialize import TENANT_META as TENANT_META
from .initialize import Initializer
from .interactions import INTERACTION_METHODS
from .listing import AcpListing
from .params import MAX_PATH_CHARS as MAX_PATH_CHARS
from .params import absolute as _absolute
from .params import directories as _directories
from .params import json_list as _list
from .params import json_object as _object
from .params import session_id_of as _session_id
from .session_access import SESSION_ACCESS_METHODS
from .session_lru import used

REPLAY_AFTER_META = "acpBroker/replayAfter"
"""``_meta`` key of ``session/resume`` (and ``session/load``): replay after this position."""
Handler = Callable[[ClientConnection, Request], Awaitable[Any]]


@dataclass
class AcpMethods:
    """Everything a connection needs to answer ACP requests."""

    settings: Settings
    log: SessionLog
    index: SessionIndex
    hub: FanoutHub
    host: AgentGateway
    cursors: CursorCodec
    access: Access
    surfaces: Mapping[int, Mapping[str, MethodHandler]] = field(default_factory=dict)
    """The methods of each protocol version (v1's where a version has none given)."""
    pages: PageCache | None = None
    """The front's list page cache (None: every page is read from Redis)."""
    list_changes: ListChanges | None = None
    """The connections told of their tenant's list changes (those that ask, at initialize)."""
    presence: PresenceBoard = field(init=False, repr=False)
    """The front's attachments: who is present on each session (``front/presence.py``)."""
    initializer: Initializer = field(init=False, repr=False)
    """``initialize``: the negotiation, and its results kept as text."""
    listing: AcpListing = field(init=False, repr=False)
    """``session/list``: the front's listing service over the index's ACP listings."""
    acl: SessionAcl = field(init=False, repr=False)
    """Sessions' roles: who may do what to each (:mod:`..session_acl`)."""

    def __post_init__(self) -> None:
        self.listing = AcpListing(self.settings, self.index, self.cursors, self.pages)
        self.acl = SessionAcl(self.log)
        self.initializer = Initializer(self.settings, self.host, self.access, self.list_changes)
        store = PresenceStore(self.index.redis, self.settings.presence_ttl)
        self.presence = PresenceBoard(self.settings, self.log, store)

    async def dispatch(self, conn: ClientConnection, request: Request) -> Any:
        if request.method == "initialize":
            return await self.initialize(conn, request)
        try:
            handler = self._handler(conn, request)
        except RpcError:
            if request.is_notification:
                return None
            raise
        if handler is None:
            return None  # unknown notifications are ignored, as JSON-RPC and ACP say
        try:
            await self.authorize(conn, request)
        except RpcError:
            if request.is_notification:
                return None  # a refused notification (a v1 cancel) changes nothing
            raise
        return await handler(self, conn, request)

    async def authorize(self, conn: ClientConnection, request: Request) -> None:
        """Refuse (-32600 ``forbidden``) an operation on a session that the principal's
        effective roles there do not allow; changes nothing (:mod:`..session_acl`)."""
        session_id = request.params.get("sessionId")
        permission = needed_permission(request.method, request.params)
        if permission is None or conn.principal is None or not isinstance(session_id, str):
            return
        await self.acl.require(conn.principal, session_id, permission, request.method)

    def _handler(self, conn: ClientConnection, request: Request) -> MethodHandler | None:
        """The handler of ``request`` on ``conn`` (None: an unknown notification); raises
        ``RpcError`` when the connection is not initialized, may not call it, or has no such
        method."""
        if conn.protocol_version is None:
            raise RpcError(
                INVALID_REQUEST, "the connection is not initialized: send initialize first"
            )
        self.access.check(conn.principal, request)
        handler = self.surfaces.get(conn.protocol_version, V1_HANDLERS).get(request.method)
        if handler is None and not request.is_notification:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {request.method}")
        return handler

    # -- initialization ---------------------------------------------------------------------

    def at_once(self, conn: ClientConnection, request: Request) -> StepAnswer | None:
        """What answers ``request`` without a task of its own, if it needs none (else it goes
        through :meth:`dispatch`), from the step that read it: ``initialize`` while what the
        agents advertised was read recently (a client's first request), and ``session/list``
        (see :meth:`~.listing.AcpListing.answer_now`), refused in the step when it is refused
        (the checks :meth:`dispatch` makes, made once)."""
        if request.method == "initialize":
            return self.initializer.initialize_now if self.host.capabilities_fresh() else None
        if request.method != "session/list":
            return None
        try:
            handler = self._handler(conn, request)
        except RpcError as refusal:
            return functools.partial(_refused, refusal)
        if handler is not AcpMethods.session_list:
            return None  # a surface that answers it otherwise
        return self.listing.answer_now(conn.tenant, request.params)

    async def initialize(self, conn: ClientConnection, request: Request) -> fastjson.Fragment:
        return await self.initializer.initialize(conn, request)

    # -- authentication ---------------------------------------------------------------------

    async def authenticate(self, conn: ClientConnection, request: Request) -> JsonObject:
        """ACP ``authenticate`` (v1) and ``auth/login`` (v2): a token in ``_meta``."""
        if not self.access.enabled:
            raise RpcError(METHOD_NOT_FOUND, "authentication is off: no authMethods advertised")
        principal = await self.access.login(request.params, conn.login_attempts)
        if conn.principal is not None and principal.tenant != conn.tenant and conn.active:
            raise invalid_params("close this connection's sessions before changing tenant")
        refusal = self.access.rebind_connection(conn.id, principal)
        if refusal is not None:
            raise connection_limit(refusal)
        conn.principal, conn.tenant = principal, principal.tenant
        conn.unauthenticated_since = None
        if self.list_changes is not None:
            self.list_changes.follow(conn)  # the tenant it hears is the one it acts for now
        return {}

    async def logout(self, conn: ClientConnection, request: Request) -> JsonObject:
        """``auth/logout``: the connection is unauthenticated again (its sessions close)."""
        if not self.access.enabled:
            raise RpcError(METHOD_NOT_FOUND, "authentication is off: no authMethods advertised")
        for session_id in list(conn.active):
            await conn.deactivate(session_id)
        conn.principal, conn.unauthenticated_since = None, time.monotonic()
        self.access.rebind_connection(conn.id, None)
        return {}

    # -- session setup ----------------------------------------------------------------------

    async def session_new(self, conn: ClientConnection, request: Request) -> Any:
        params = request.params
        cwd = _absolute(params.get("cwd"), "cwd")
        dirs = _directories(params.get("additionalDirectories"))
        meta = _object(params.get("_meta"), "_meta")
        agent = meta.get(AGENT_META_KEY, self.host.default_agent)
        if not isinstance(agent, str):
            raise invalid_params(f"_meta.{AGENT_META_KEY} must be an agent name")
        kind = meta.get(KIND_META_KEY, self.host.kind_of(agent))
        if kind not in SESSION_KINDS:
            raise invalid_params(f"_meta.{KIND_META_KEY} must be one of {', '.join(SESSION_KINDS)}")
        user_meta = {k: v for k, v in meta.items() if k not in (AGENT_META_KEY, KIND_META_KEY)}
        agent_params = _agent_params(params, cwd, dirs, user_meta)
        await check_session_quota(
            self.index.redis, conn.tenant, self.settings.max_sessions_per_tenant
        )
        session_id, reply = await self.host.new_session(
            conn.tenant,
            agent_params,
            agent=agent,
            kind=kind,
            meta=without_trace(user_meta),
            origin=conn.id,
        )
        await self.opened(conn, session_id, replay_after=0)
        conn.reply(request, reply)
        conn.release(session_id)
        return DEFERRED

    async def session_fork(self, conn: ClientConnection, request: Request) -> Any:
        """``session/fork`` (ACP unstable): a new session, listed and live like any, whose log
        starts with the parent's history up to the fork; active here from the reply on."""
        params = request.params
        snapshot = await self._snapshot(conn, params)
        cwd = _absolute(params.get("cwd"), "cwd")
        dirs = _directories(params.get("additionalDirectories"))
        meta = _object(params.get("_meta"), "_meta")
        user_meta = {k: v for k, v in meta.items() if k not in (AGENT_META_KEY, KIND_META_KEY)}
        agent_params = _agent_params(params, cwd, dirs, user_meta)
        session_id, reply, copied = await self.host.fork(
            conn.tenant, snapshot.session_id, agent_params, meta=user_meta, origin=conn.id
        )
        # The copied history is the parent's, which this client has: it gets what follows.
        await self.opened(conn, session_id, replay_after=copied)
        conn.reply(request, reply)
        conn.release(session_id)
        return DEFERRED

    async def opened(self, conn: ClientConnection, session_id: str, *, replay_after: int) -> None:
        """A session an agent host just made: listed now and active on ``conn``, each step
        tried again while the store is out of reach for a moment, within the request's
        deadline. The session exists already: an error here would have its client ask for
        another, and leave this one orphaned in the list."""
        tenant, bound = conn.tenant, self.settings.request_timeout
        principal = conn.principal
        try:
            if principal is not None:  # its maker is the session's first owner
                await retrying(lambda: self.acl.record_owner(principal, session_id), bound)
            await retrying(lambda: self.project(tenant, session_id), bound)
            await retrying(
                lambda: conn.activate(
                    tenant, session_id, replay_after=replay_after, replay_now=False
                ),
                bound,
            )
        except SessionMissing:  # made, then lost by a failover: not an internal error
            raise session_lost(session_id) from None

    async def session_load(self, conn: ClientConnection, request: Request) -> Any:
        reopened = await self.reopen(conn, request, replay_default=0)
        return await self.reattach(conn, request, reopened)

    async def session_resume(self, conn: ClientConnection, request: Request) -> Any:
        reopened = await self.reopen(conn, request, replay_default=None)
        return await self.reattach(conn, request, reopened)

    async def reattach(self, conn: ClientConnection, request: Request, reopened: Reopened) -> Any:
        """Have an agent hold the session, replay what comes after ``reopened.after``, then
        answer (the host the lease named, read with the snapshot, is asked first)."""
        snapshot = reopened.snapshot
        reply = await self.host.attach(
            conn.tenant, snapshot.session_id, self._agent_params(request), holder=reopened.holder
        )
        await conn.activate(
            conn.tenant, snapshot.session_id, replay_after=reopened.after, replay_now=True
        )
        # Whole, however the session was held: an agent already holding it replies {}.
        window = snapshot.window
        if snapshot.archived:  # an archived snapshot leaves the window out: fold the log's
            window = await self.log.window(conn.tenant, snapshot.session_id)
        conn.reply(request, with_window(_without_session_id(reply), window))
        conn.release(snapshot.session_id)
        return DEFERRED

    async def reopen(
        self, conn: ClientConnection, request: Request, *, replay_default: int | None
    ) -> Reopened:
        """A load's or a resume's session and position, checked (one store round trip)."""
        params = request.params
        session_id = _session_id(params)
        try:
            snapshot, holder = await self.log.snapshot_and_holder(conn.tenant, session_id)
        except SessionMissing:
            raise session_not_found(session_id) from None
        if snapshot.deleted:
            raise session_not_found(session_id)
        cwd = _absolute(params.get("cwd"), "cwd")
        if normalize_cwd(cwd) != normalize_cwd(snapshot.cwd):
            raise invalid_params("cwd does not match the session's working directory")
        _directories(params.get("additionalDirectories"))
        meta = _object(params.get("_meta"), "_meta")
        after = replay_default
        if REPLAY_AFTER_META in meta:
            after = _replay_position(meta[REPLAY_AFTER_META], snapshot)
        return Reopened(snapshot, after, holder)

    def _agent_params(self, request: Request) -> JsonObject:
        params = request.params
        out: JsonObject = {"mcpServers": _list(params.get("mcpServers"), "mcpServers")}
        if params.get("additionalDirectories"):
            out["additionalDirectories"] = params["additionalDirectories"]
        return with_trace(out, trace_fields(params))

    # -- prompt turn ------------------------------------------------------------------------

    async def session_prompt(self, conn: ClientConnection, request: Request) -> Any:
        session_id = self.active_session(conn, request.params)
        if not isinstance(request.params.get("prompt"), list):
            raise invalid_params("prompt must be a list of content blocks")
        prompt_id = client_prompt_id(request.params)  # named: see protocol.turns
        outcome = await self.host.prompt(
            conn.tenant, session_id, request.params, conn.id, prompt_id, conn.principal
        )
        await self.project(conn.tenant, session_id)
        await conn.wait_delivered(session_id, outcome.position.seq)
        return outcome.result

    async def session_cancel(self, conn: ClientConnection, request: Request) -> None:
        """Cancel the session's running turn; with an ``activityId`` (the draft's param, or
        ``_meta.activityId``: a prompt's id), only that prompt: one still queued is withdrawn,
        one that ended is a logged no-op."""
        session_id = request.params.get("sessionId")
        if isinstance(session_id, str) and session_id in conn.active:
            activity = activity_id(request.params)
            await self.host.cancel(conn.tenant, session_id, activity, author_of(conn))

    async def session_set_mode(self, conn: ClientConnection, request: Request) -> Any:
        session_id = self.active_session(conn, request.params)
        if not isinstance(request.params.get("modeId"), str):
            raise invalid_params("modeId must be a string")
        return await self.host.forward(conn.tenant, session_id, "session/set_mode", request.params)

    async def session_set_config_option(self, conn: ClientConnection, request: Request) -> Any:
        session_id = self.active_session(conn, request.params)
        if not isinstance(request.params.get("configId"), str) or "value" not in request.params:
            raise invalid_params("configId (a string) and value are required")
        method = "session/set_config_option"
        return await self.host.forward(conn.tenant, session_id, method, request.params)

    async def session_set_title(self, conn: ClientConnection, request: Request) -> Any:
        """``session/set_title`` (ACP unstable): set the title, answer ``{title}`` as stored.

        Beyond ACP: ``title`` may be null (cleared) or left out when ``_meta`` is given;
        ``_meta`` (an object, or null to clear) patches the session's metadata by
        top-level key, as ``session_info_update`` does. Every connection where the
        session is active gets the update after the requester's reply.
        """
        params = request.params
        snapshot = await self._snapshot(conn, params)
        update = title_update(params)
        active = conn.active.get(snapshot.session_id)
        if active is not None:
            active.held = active.held or []
        try:
            await self.log.append(
                conn.tenant,
                snapshot.session_id,
                {"type": EventType.UPDATE, "update": update, "origin": conn.id},
            )
            stored = await self.log.snapshot(conn.tenant, snapshot.session_id)
            await self.index.project(stored)
            # The title this change stored (a later change may already be in the log);
            # none stored (cleared, or never set) is "": ACP's reply requires a string.
            title = update.get("title", stored.title)
            conn.reply(request, {"title": title or ""})
        finally:
            conn.release(snapshot.session_id)
        return DEFERRED

    # -- session lifecycle ------------------------------------------------------------------

    async def session_close(self, conn: ClientConnection, request: Request) -> JsonObject:
        session_id = self.active_session(conn, request.params)
        await self.host.close(conn.tenant, session_id, conn.id)
        await conn.deactivate(session_id)
        return {}

    async def session_delete(self, conn: ClientConnection, request: Request) -> JsonObject:
        session_id = _session_id(request.params)
        try:
            snapshot = await self.log.snapshot(conn.tenant, session_id)
        except SessionMissing:
            return {}  # deleting what never existed succeeds silently
        if not snapshot.deleted:
            await self.log.append(conn.tenant, session_id, {"type": EventType.DELETED})
            await self.host.release(conn.tenant, session_id)
            await self.project(conn.tenant, session_id)
        await conn.deactivate(session_id)
        return {}

    async def session_list(self, conn: ClientConnection, request: Request) -> fastjson.Fragment:
        """``session/list``: a page through the front's listing service (:mod:`.listing`)."""
        return await self.listing.session_list(conn.tenant, request.params)

    # -- helpers ----------------------------------------------------------------------------

    async def _snapshot(self, conn: ClientConnection, params: JsonObject) -> SessionSnapshot:
        session_id = _session_id(params)
        try:
            snapshot = await self.log.snapshot(conn.tenant, session_id)
        except SessionMissing:
            raise session_not_found(session_id) from None
        if snapshot.deleted:
            raise session_not_found(session_id)
        return snapshot

    def active_session(self, conn: ClientConnection, params: JsonObject) -> str:
        """The ``sessionId`` of the params, which must be active on the connection (-32002)."""
        session_id = _session_id(params)
        session = conn.active.get(session_id)
        if session is None:
            raise session_not_found(session_id, "active session")
        used(session)  # the least recently used idle sessions are let go first (session_lru)
        self.presence.touch(conn.id, session_id)
        return session_id

    async def project(self, tenant: str, session_id: str) -> None:
        """Bring the index up to date now, so the caller's next list sees its change."""
        await self.index.project(await self.log.snapshot(tenant, session_id))


@dataclass
class Reopened:
    """A session a load or resume reopens: its snapshot, the seq the replay starts after
    (None: no replay), and the agent host holding its lease (None: none does)."""

    snapshot: SessionSnapshot
    after: int | None
    holder: str | None


def _replay_position(value: Any, snapshot: SessionSnapshot) -> int:
    """A position the broker gave out (``_meta.acpBroker/position``), checked against the log."""
    if not isinstance(value, dict):
        raise invalid_params(f"{REPLAY_AFTER_META} must be an object like {POSITION_META}")
    seq, epoch = value.get("seq"), value.get("epoch")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(epoch, str):
        raise invalid_params(f"{REPLAY_AFTER_META} needs an integer seq and a string epoch")
    check_position(seq, epoch, log_epoch=snapshot.epoch, head=snapshot.given)
    return seq


def author_of(conn: ClientConnection) -> str:
    """Who a connection's prompts and cancels are by: its principal's subject."""
    return conn.principal.subject if conn.principal is not None else ""


def title_update(params: JsonObject) -> JsonObject:
    """The ``session_info_update`` a ``session/set_title`` request stands for (-32602 if bad)."""
    update: JsonObject = {"sessionUpdate": "session_info_update"}
    if "title" in params:
        title = params["title"]
        if title is not None and not isinstance(title, str):
            raise invalid_params("title must be a string or null")
        update["title"] = title
    if "_meta" in params:
        patch = params["_meta"]
        if patch is not None and not isinstance(patch, dict):
            raise invalid_params("_meta must be an object or null")
        # Trace context is propagation, not metadata (a traced front adds it to every
        # request): it must not be patched into the session's _meta.
        if not patch:
            update["_meta"] = patch
        elif kept := without_trace(patch):
            update["_meta"] = kept
    if len(update) == 1:
        raise invalid_params("give title and/or _meta")
    return update


def _agent_params(
    params: JsonObject, cwd: str, dirs: list[str], user_meta: JsonObject
) -> JsonObject:
    """What the agent is sent to make a session (``session/new``, ``session/fork``); the
    user's ``_meta`` goes with it, the trace context too: the agent's to follow."""
    agent_params: JsonObject = {
        "cwd": cwd,
        "mcpServers": _list(params.get("mcpServers"), "mcpServers"),
    }
    if dirs:
        agent_params["additionalDirectories"] = dirs
    if user_meta:
        agent_params["_meta"] = user_meta
    return agent_params


def _without_session_id(reply: JsonObject) -> JsonObject:
    return {k: v for k, v in reply.items() if k != "sessionId"}


def _refused(refusal: RpcError, conn: ClientConnection, request: Request) -> Any:
    """A :data:`StepAnswer` that refuses the request as :meth:`AcpMethods.dispatch` would."""
    raise refusal


MethodHandler = Callable[[AcpMethods, ClientConnection, Request], Awaitable[Any]]
"""An ACP method, unbound: the surfaces of both versions are tables of these."""

V1_HANDLERS: Mapping[str, MethodHandler] = {
    "authenticate": AcpMethods.authenticate,
    "session/new": AcpMethods.session_new,
    "session/fork": AcpMethods.session_fork,
    "session/load": AcpMethods.session_load,
    "session/resume": AcpMethods.session_resume,
    "session/prompt": AcpMethods.session_prompt,
    "session/cancel": AcpMethods.session_cancel,
    "session/set_mode": AcpMethods.session_set_mode,
    "session/set_config_option": AcpMethods.session_set_config_option,
    "session/set_title": AcpMethods.session_set_title,
    "session/close": AcpMethods.session_close,
    "session/delete": AcpMethods.session_delete,
    "session/list": AcpMethods.session_list,
    **INTERACTION_METHODS,
    **ATTACH_METHODS,
    **SESSION_ACCESS_METHODS,
}
