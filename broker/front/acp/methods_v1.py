"""ACP v1 methods as the broker answers them.

Each handler validates its params at the edge, then acts through the store,
the hub and the agent host. Handlers that must order their reply against the
session's events (new, load, resume, set_title) send the reply themselves and
return :data:`DEFERRED`.
"""

from __future__ import annotations

import asyncio
import functools
import posixpath
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from ... import fastjson
from ...config import AGENT_META_KEY, KIND_META_KEY, SESSION_KINDS, Settings
from ...ops import tracing
from ...protocol import capabilities, v2
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
from ...protocol.render import POSITION_META, check_position
from ...protocol.trace import trace_fields, with_trace, without_trace
from ...store.cursors import CursorCodec, InvalidCursor, fingerprint
from ...store.events import EventType, SessionSnapshot
from ...store.index import ACP_LISTING, Page, SessionIndex, cwd_listing, normalize_cwd
from ...store.log import SessionLog, SessionMissing
from ...store.names import SESSION_ID_RULE, is_session_id
from ...store.quotas import check_session_quota
from ...store.retry import retrying
from ..fanout import FanoutHub
from ..list_changes import ListChanges
from ..pages import Key, PageCache
from .access import Access, connection_limit
from .connection import ClientConnection
from .dispatch import DEFERRED, IN_TASK, InTask, PendingRead, StepAnswer

PROTOCOL_VERSION = 1
REPLAY_AFTER_META = "acpBroker/replayAfter"
"""``_meta`` key of ``session/resume`` (and ``session/load``): replay after this position."""
TENANT_META = "acpBroker/tenant"
"""``_meta`` key of the v2 ``initialize`` reply: the tenant the connection acts for."""
AGENTS_META = "acpBroker/agents"
"""``_meta`` key of the v2 ``initialize`` reply: the configured agents, the default first."""

Handler = Callable[[ClientConnection, Request], Awaitable[Any]]
_INITIALIZED_ENTRIES = 1024
"""``initialize`` results kept (one per version, and per tenant for v2's)."""


@dataclass
class _InitializeCache:
    """``initialize`` results as JSON text, valid for one ``agent_capabilities()`` object."""

    agents: JsonObject | None = None
    texts: dict[tuple[int, str], str] = field(default_factory=dict)


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
    _initialized: _InitializeCache = field(default_factory=lambda: _InitializeCache(), repr=False)

    async def dispatch(self, conn: ClientConnection, request: Request) -> Any:
        if request.method == "initialize":
            return await self.initialize(conn, request)
        if conn.protocol_version is None:
            if request.is_notification:
                return None
            raise RpcError(
                INVALID_REQUEST, "the connection is not initialized: send initialize first"
            )
        try:
            self.access.check(conn.principal, request)
        except RpcError:
            if request.is_notification:
                return None
            raise
        handler = self.surfaces.get(conn.protocol_version, V1_HANDLERS).get(request.method)
        if handler is None:
            if request.is_notification:
                return None  # unknown notifications are ignored, as JSON-RPC and ACP say
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {request.method}")
        return await handler(self, conn, request)

    # -- initialization ---------------------------------------------------------------------

    def at_once(self, conn: ClientConnection, request: Request) -> StepAnswer | None:
        """What answers ``request`` without a task of its own, if it needs none (else it goes
        through :meth:`dispatch`), from the step that read it: ``initialize`` while what the
        agents advertised was read recently (a client's first request), and ``session/list``
        (a page this front keeps, or one read on the index's bare connection)."""
        if request.method == "initialize":
            return self._initialize_now if self.host.capabilities_fresh() else None
        if request.method == "session/list":
            return self._list_at_once(conn, request)
        return None

    def _list_at_once(self, conn: ClientConnection, request: Request) -> StepAnswer | None:
        """The answer to a ``session/list`` the connection may give without a task: a page
        the cache holds; a page being read ahead, once that read lands; a page read on the
        index's bare connection while one is open and its reply's timeout bounds the read
        within the request's deadline (a missing page, or no cache); None for the rest (a
        refusal, a bad param, a traced request, no bare connection: :meth:`dispatch`
        answers them as ever)."""
        version = conn.protocol_version
        if version is None:
            return None
        handler = self.surfaces.get(version, V1_HANDLERS).get(request.method)
        if handler is not AcpMethods.session_list:
            return None
        try:
            self.access.check(conn.principal, request)
        except RpcError:
            return None
        pages = self.pages
        key = None
        if pages is not None and pages.live:
            key = _page_key(conn.tenant, request.params, self.settings.list_page_size)
            text = pages.hit(key) if key is not None else None
            if text is not None:
                return functools.partial(_given, fastjson.Fragment(text))
        bound = self.index.page_timeout
        if bound is None or bound > self.settings.request_timeout or tracing.active():
            return None
        if pages is not None and key is not None and pages.reading_ahead(key):
            return functools.partial(self._list_joined, pages, key, bound)
        return self._list_later

    def _list_joined(
        self, pages: PageCache, key: Key, bound: float, conn: ClientConnection, request: Request
    ) -> PendingRead | InTask:
        """``session/list`` of a page being read ahead: answered once that read has landed,
        not read a second time (a client paging through faster than a read ahead lands).
        Waited for at most ``bound`` seconds; a page not kept by then (its tenant changed,
        its read failed or is slow) is read as any miss, dispatched with what is left of the
        request's deadline."""
        landed = pages.landed(key, bound)
        if landed is None:  # it landed between the two looks: read as any miss
            return IN_TASK

        def finish(_: asyncio.Future[Any]) -> fastjson.Fragment | InTask:
            text = pages.hit(key)
            if text is None:
                return IN_TASK
            return fastjson.Fragment(text)

        return PendingRead(landed, finish)

    def _list_later(self, conn: ClientConnection, request: Request) -> PendingRead | InTask:
        """``session/list`` answered from the callback of its page's read, sent now on the
        index's bare connection (or, none being open, dispatched)."""
        listing, after, mark = self._list_query(conn.tenant, request.params)
        limit = self.settings.list_page_size
        read = self.index.begin_page(conn.tenant, listing, after, limit)
        if read is None:
            return IN_TASK
        pages, key = self.pages, _page_key(conn.tenant, request.params, limit)
        token = None
        if pages is not None and key is not None:
            pages.missed()
            token = pages.begin()

        async def again(direct: bool) -> fastjson.Fragment:
            # Read here, not dispatched: this ask's miss is counted (once) above.
            page = await self.index.page(conn.tenant, listing, after, limit, direct=direct)
            return keep(page)

        def keep(page: Page) -> fastjson.Fragment:
            if pages is None or key is None:
                return fastjson.Fragment(self._list_text(page, mark))
            query = _ListQuery(conn.tenant, request.params, listing, after, mark)
            return fastjson.Fragment(self._kept(query, key, token, page))

        def finish(future: asyncio.Future[Any]) -> fastjson.Fragment | InTask:
            try:
                page = self.index.read_page(read, limit)
            except RedisError:  # the client's way recovers from anything
                # Not on the bare connection again: a stalled server would fail it as slowly.
                return InTask(functools.partial(again, False))
            if page is None:  # members of an earlier format: they need the rows too
                return InTask(functools.partial(again, True))
            return keep(page)

        return PendingRead(read[1], finish, read[0].in_step)

    async def initialize(self, conn: ClientConnection, request: Request) -> fastjson.Fragment:
        await self.host.refresh_capabilities()
        return self._initialize_now(conn, request)

    def _initialize_now(self, conn: ClientConnection, request: Request) -> fastjson.Fragment:
        if conn.protocol_version is not None:
            raise RpcError(INVALID_REQUEST, "the connection is already initialized")
        version = request.params.get("protocolVersion")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise invalid_params("protocolVersion must be a non-negative integer")
        negotiated = v2.negotiate(version)
        caps_field = "clientCapabilities" if negotiated == PROTOCOL_VERSION else "capabilities"
        caps = request.params.get(caps_field)
        conn.client_capabilities = caps if isinstance(caps, dict) else {}
        conn.protocol_version = negotiated
        if self.list_changes is not None:
            self.list_changes.follow(conn)
        return self._initialize_result(negotiated, conn.tenant)

    def _initialize_result(self, version: int, tenant: str) -> fastjson.Fragment:
        """The ``initialize`` result as JSON text, made once per version and tenant until
        what the agents advertised changes: a node's clients reconnecting elsewhere at once
        send thousands a second, all answered alike."""
        agents = self.host.agent_capabilities()
        cache = self._initialized
        if cache.agents is not agents or len(cache.texts) >= _INITIALIZED_ENTRIES:
            cache.agents, cache.texts = agents, {}
        key = (version, tenant if version == v2.V2 else "")
        text = cache.texts.get(key)
        if text is None:
            text = cache.texts[key] = fastjson.dumps(self._fresh_initialize_result(version, tenant))
        return fastjson.Fragment(text)

    def _fresh_initialize_result(self, version: int, tenant: str) -> JsonObject:
        agents = self.host.agent_capabilities()
        if version == v2.V2:
            result = v2.initialize_result(agents)
            result["authMethods"] = self.access.auth_methods(v2.V2)
            result["_meta"] = self._broker_meta(tenant)
            return result
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": capabilities.v1_agent_capabilities(agents),
            "authMethods": self.access.auth_methods(PROTOCOL_VERSION),
            "agentInfo": dict(v2.BROKER_INFO),
        }

    def _broker_meta(self, tenant: str) -> JsonObject:
        """What a v2 client learns of this deployment at ``initialize``: the tenant it acts
        for, and the agents it may start sessions on (the default first)."""
        agents = [{"name": a.name, "kind": a.kind} for a in self.settings.agent_list()]
        return {TENANT_META: tenant, AGENTS_META: agents}

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
        await self._opened(conn, session_id, replay_after=0)
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
        await self._opened(conn, session_id, replay_after=copied)
        conn.reply(request, reply)
        conn.release(session_id)
        return DEFERRED

    async def _opened(self, conn: ClientConnection, session_id: str, *, replay_after: int) -> None:
        """A session an agent host just made: listed now and active on ``conn``, each step
        tried again while the store is out of reach for a moment, within the request's
        deadline. The session exists already: an error here would have its client ask for
        another, and leave this one orphaned in the list."""
        tenant, bound = conn.tenant, self.settings.request_timeout
        await retrying(lambda: self.project(tenant, session_id), bound)
        await retrying(
            lambda: conn.activate(tenant, session_id, replay_after=replay_after, replay_now=False),
            bound,
        )

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
        conn.reply(request, _without_session_id(reply))
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
        outcome = await self.host.prompt(conn.tenant, session_id, request.params, conn.id)
        await self.project(conn.tenant, session_id)
        await conn.wait_delivered(session_id, outcome.position.seq)
        return outcome.result

    async def session_cancel(self, conn: ClientConnection, request: Request) -> None:
        session_id = request.params.get("sessionId")
        if isinstance(session_id, str) and session_id in conn.active:
            await self.host.cancel(conn.tenant, session_id)

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
        listing, after, mark = self._list_query(conn.tenant, request.params)
        pages = self.pages
        key = _page_key(conn.tenant, request.params, self.settings.list_page_size)
        if pages is None or key is None:
            return fastjson.Fragment(await self._list_reply(conn.tenant, listing, after, mark))
        # The reply itself is kept: a hit costs no Redis round trip, no splice, no cursor.
        text = pages.get(key)
        if text is None:
            token = pages.begin()
            page = await self.index.page(conn.tenant, listing, after, self.settings.list_page_size)
            query = _ListQuery(conn.tenant, request.params, listing, after, mark)
            text = self._kept(query, key, token, page)
        return fastjson.Fragment(text)

    def _kept(self, query: _ListQuery, key: Key, token: int | None, page: Page) -> bytes:
        """The reply text of ``page``, read from Redis for a client's ask of ``key``: kept
        (read again when its tenant changes), and the page after it read ahead."""
        text = self._list_text(page, query.mark)
        if self.pages is not None:
            reload = functools.partial(
                self._list_reply, query.tenant, query.listing, query.after, query.mark
            )
            self.pages.put(key, token, text, reload)
            # Once the reply is written: the read ahead is no part of this answer's wait.
            self.pages.soon(self._read_ahead, query, _next_after(page))
        return text

    def _read_ahead(self, query: _ListQuery, after: str | None) -> None:
        """Have the page after position ``after`` (None: there is none) read ahead (a client
        paging through asks for it next); when it is first asked for, the one after it is
        read ahead in turn."""
        pages, limit = self.pages, self.settings.list_page_size
        if pages is None or after is None:
            return
        params = {**query.params, "cursor": self.cursors.encode(after, query.mark)}
        key = _page_key(query.tenant, params, limit)
        if key is None:
            return
        following = _ListQuery(query.tenant, params, query.listing, after, query.mark)

        async def read() -> tuple[bytes, Callable[[], None]]:
            ahead = await self.index.page(query.tenant, query.listing, after, limit)
            # What is kept for its first ask is where it ends, not the page (kept as text).
            then = functools.partial(self._read_ahead, following, _next_after(ahead))
            return self._list_text(ahead, query.mark), then

        pages.read_ahead(key, read)

    def _list_query(self, tenant: str, params: JsonObject) -> tuple[str, str | None, str]:
        """A ``session/list``'s listing, the position it starts after and its cursors'
        fingerprint, from its params (checked: -32602)."""
        cwd = params.get("cwd")
        if cwd is not None and type(cwd) is not str:
            _absolute(cwd, "cwd")  # raises: only a string is a path (nor can it be a key)
        listing, mark = _acp_listing(tenant, cwd)
        after = None
        cursor = params.get("cursor")
        if cursor is not None:
            if not isinstance(cursor, str):
                raise invalid_params("cursor must be a string")
            try:
                after = self.cursors.decode(cursor, mark)
            except InvalidCursor as exc:
                raise invalid_params(f"invalid cursor: {exc}") from None
        return listing, after, mark

    async def _list_reply(self, tenant: str, listing: str, after: str | None, mark: str) -> bytes:
        """A ``session/list`` result as JSON text (UTF-8), read from the index."""
        page = await self.index.page(tenant, listing, after, self.settings.list_page_size)
        return self._list_text(page, mark)

    def _list_text(self, page: Page, mark: str) -> bytes:
        """The ``session/list`` result of ``page``, spliced from the rows' SessionInfo texts
        as read (one fragment, not one per row: each one costs the encoder a call back into
        Python), in UTF-8: it goes into the reply's frame as it is."""
        if not (page.has_more and page.last is not None):
            return b"".join((b'{"sessions":[', page.infos, b"]}"))
        cursor = fastjson.dumps(self.cursors.encode(page.last, mark)).encode()
        return b"".join((b'{"sessions":[', page.infos, b'],"nextCursor":', cursor, b"}"))

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
        if session_id not in conn.active:
            raise session_not_found(session_id, "active session")
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


@functools.lru_cache(maxsize=4096)
def _acp_listing(tenant: str, cwd: str | None) -> tuple[str, str]:
    """The listing a ``session/list``'s ``cwd`` (checked: -32602, never kept) names, and its
    cursors' fingerprint, computed once per tenant and cwd as given: the checks, the path's
    normal form and its listing's digest were 4% of an uncached front's samples a page."""
    if cwd is None:
        return ACP_LISTING, fingerprint(tenant, "acp", {})
    cwd = normalize_cwd(_absolute(cwd, "cwd"))
    return cwd_listing(cwd), fingerprint(tenant, "acp", {"cwd": cwd})


def _session_id(params: JsonObject) -> str:
    """The request's ``sessionId``, which must have the one shape the broker's ids have
    (so that no id, however spelled, names another tenant's keys)."""
    session_id = params.get("sessionId")
    if not isinstance(session_id, str) or not session_id:
        raise invalid_params("sessionId must be a non-empty string")
    if not is_session_id(session_id):
        raise invalid_params(f"sessionId is not a session id of this broker ({SESSION_ID_RULE})")
    return session_id


MAX_PATH_CHARS = 4096
"""The longest path the broker takes (Linux's ``PATH_MAX``): a ``cwd`` is kept, per tenant,
in the listings' caches, so its length bounds what a client can make them hold."""


def _absolute(value: Any, name: str) -> str:
    """An absolute POSIX path in normal form (a trailing ``/`` aside): no NUL, no ``.`` or
    ``..`` component, no ``//``, since it is handed to an agent as where it works."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise invalid_params(f"{name} must be an absolute path")
    if len(value) > MAX_PATH_CHARS:  # none longer names a directory; the caches keep paths
        raise invalid_params(f"{name} must be at most {MAX_PATH_CHARS} characters")
    if "\0" in value:
        raise invalid_params(f"{name} must not hold a NUL character")
    if ".." in value.split("/"):
        raise invalid_params(f"{name} must not hold a '..' component")
    if posixpath.normpath("/" + value.lstrip("/")) != normalize_cwd(value):
        raise invalid_params(f"{name} must be a normalized path (no '.' component, no '//')")
    return value


def _directories(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_params("additionalDirectories must be a list of absolute paths")
    return [_absolute(item, "each of additionalDirectories") for item in value]


def _object(value: Any, name: str) -> JsonObject:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_params(f"{name} must be an object")
    return value


def _list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_params(f"{name} must be a list")
    return value


def _replay_position(value: Any, snapshot: SessionSnapshot) -> int:
    """A position the broker gave out (``_meta.acpBroker/position``), checked against the log."""
    if not isinstance(value, dict):
        raise invalid_params(f"{REPLAY_AFTER_META} must be an object like {POSITION_META}")
    seq, epoch = value.get("seq"), value.get("epoch")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(epoch, str):
        raise invalid_params(f"{REPLAY_AFTER_META} needs an integer seq and a string epoch")
    check_position(seq, epoch, log_epoch=snapshot.epoch, head=snapshot.seq)
    return seq


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


def _page_key(tenant: str, params: JsonObject, limit: int) -> tuple[Any, ...] | None:
    """The page cache's key of a ``session/list``: the tenant, the ``cwd`` and ``cursor`` as
    given, the page size; None unless both are strings or absent (the handler refuses them).

    The texts, not what they decode to: a page is kept only once its request was checked,
    and the same texts check the same way for the same tenant (the cursor keys are fixed
    for the front's life), so a hit needs no cursor verification."""
    cwd, cursor = params.get("cwd"), params.get("cursor")
    if (cwd is None or type(cwd) is str) and (cursor is None or type(cursor) is str):
        return (tenant, "acp", cwd, cursor, limit)
    return None


def _next_after(page: Page) -> str | None:
    """The position the page after ``page`` starts after (None: it is the last)."""
    return page.last if page.has_more else None


@dataclass(frozen=True, slots=True)
class _ListQuery:
    """A checked ``session/list``: whose, its params as given, the listing it reads, the
    position it starts after and its cursors' fingerprint."""

    tenant: str
    params: JsonObject
    listing: str
    after: str | None
    mark: str


def _given(page: fastjson.Fragment, conn: ClientConnection, request: Request) -> Any:
    """A :data:`StepAnswer` known before it was asked for (a kept page)."""
    return page


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
}
