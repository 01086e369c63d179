"""A front node: the WebSocket endpoint and the HTTP listener, wired to the store.

:class:`FrontNode` assembles the parts of a front (fan-out, the path to agent
hosts, the ACP methods, HTTP). It knows no other role: roles that run in the
same process (``serve`` runs an agent host and a projector beside the front,
see :mod:`broker.serve`) are handed to it as :class:`Colocated` and started and
stopped with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import socket
import ssl
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, cast

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.typing import Subprotocol

from ..auth.authenticator import (
    SUBPROTOCOL_PREFIX,
    Authenticator,
    websocket_token,
)
from ..auth.principal import AuthError, Principal
from ..config import Settings
from ..lifetimes import RoleLoops
from ..logs import install_redaction
from ..loops import stop_within
from ..ops import metrics
from ..ops.health import Health
from ..ops.server import ops_response
from ..protocol import v2
from ..protocol.turns import PROMPT_OUTCOME
from ..store.archive import open_archive
from ..store.client import Store, connect, embedded_warning
from ..store.cursors import CursorCodec
from ..store.guard import StoreGuard
from ..store.http_links import HttpLinks
from ..store.index import SessionIndex
from ..store.log import SessionLog
from .acp import websocket_only
from .acp.access import Access
from .acp.connection import CLOSE_GOING_AWAY, ClientConnection
from .acp.flow import waiting_bound
from .acp.keepalive import Keepalive
from .acp.methods_v1 import V1_HANDLERS, AcpMethods
from .acp.methods_v2 import V2_HANDLERS
from .acp.operations import with_operations
from .acp.turn_outcome import prompt_outcome
from .agents import RemoteAgents
from .fanout import FanoutHub
from .http.app import FrontHttp, http_url
from .http.console import Console, same_origin_console
from .http.event_stream import EventStream
from .http.session_tools import SessionTools, tool_access
from .http.sessions import sessions_service
from .list_changes import ListChanges
from .pages import IndexWatch, PageCache
from .revocation import CredentialWatch
from .routing import NodeRouter
from .streamable import remote_frames
from .streamable.endpoint import AcpHttpEndpoint
from .streamable.reliable_ws import ReliableWebSocket
from .streamable.service import StreamableHttp

log = logging.getLogger(__name__)

CONNECTION_ID_HEADER = "Acp-Connection-Id"
STOP_TIMEOUT = 30.0
"""Seconds each part of a stopping node (HTTP, each role, fan-out) may take before it is
abandoned with its tasks' stacks logged: a shutdown ends, whatever one part does."""


class Colocated(Protocol):
    """A role run in the front's process, started after its fan-out and stopped before it
    (``serve``'s agent host and projector, each an async context manager of its own)."""

    async def start(self) -> None: ...

    async def stop(self, *, hand_over: bool = False) -> None: ...


class FrontNode:
    """One front node: connections, the ACP surface, fan-out, REST and MCP."""

    def __init__(self, settings: Settings, *, redis: Store | None = None) -> None:
        self.settings = settings
        install_redaction()
        if redis is None and settings.redis_url is None:
            log.warning("%s", embedded_warning())
        self._owns_redis = redis is None
        self.redis = (
            redis
            if redis is not None
            else connect(settings.redis_url, timeout=settings.redis_timeout)
        )
        location = settings.archive_location()
        self.archive = open_archive(location) if location is not None else None
        self.log = SessionLog(
            self.redis,
            feed_maxlen=settings.feed_maxlen,
            archive=self.archive,
            max_events=settings.max_events_per_session,
        )
        self.log.wait_for_replicas(settings.redis_wait_replicas, settings.redis_wait_timeout)
        self.pages = PageCache(settings.list_cache_pages) if settings.list_cache else None
        if self.pages is not None:
            self.pages.refreshing = settings.list_cache_refresh
        self.index = SessionIndex(
            self.redis, changed=self.pages.invalidate if self.pages is not None else None
        )
        self.list_changes = ListChanges()
        """The connections told of their tenant's list changes (``acpBroker/listChanged``)."""
        self.index_watch = IndexWatch(self.redis, self.pages, listener=self.list_changes)
        """The index's announcements: they keep the page cache fresh and tell listeners."""
        self.hub = FanoutHub(self.redis, self.log)
        self.agents = RemoteAgents(
            self.redis,
            settings.agent_list(),
            reply_channel=self.hub.node_channel,
            ack_timeout=settings.ack_timeout,
        )
        self.hub.listener = NodeRouter(
            self.redis, self.hub, self.agents, answer_timeout=settings.answer_timeout
        )
        self.authenticator = Authenticator(settings, self.redis)
        if not self.authenticator.enabled and not _loopback_only(settings):
            log.warning(
                "AUTHENTICATION IS OFF on %s: anyone who can reach this port acts as tenant %r",
                settings.host,
                settings.tenant,
            )
        self.access = Access(settings, self.authenticator)
        self.methods = AcpMethods(
            settings,
            self.log,
            self.index,
            self.hub,
            self.agents,
            CursorCodec(settings.cursor_keys()),
            self.access,
            surfaces={
                v2.V1: with_operations({**V1_HANDLERS, PROMPT_OUTCOME: prompt_outcome}),
                v2.V2: with_operations({**V2_HANDLERS, PROMPT_OUTCOME: prompt_outcome}),
            },
            pages=self.pages,
            list_changes=self.list_changes,
        )
        self._principals: dict[str, Principal | None] = {}
        self.connections: set[ClientConnection] = set()
        self.keepalive = Keepalive(settings.ping_interval, timeout=settings.ping_interval)
        """Pings every connection (one loop for all, not websockets' task each)."""
        self._server: Server | None = None
        self.colocated: list[Colocated] = []
        """Roles started and stopped with this node (``serve``: agent host, projector)."""
        self.stalled_stops: list[str] = []
        """Parts whose stop was abandoned after :data:`STOP_TIMEOUT` (logged with stacks)."""
        self.credentials = CredentialWatch(
            self.authenticator.tokens,
            lambda: self.connections,
            settings.credential_check_interval,
            settings.login_timeout,
        )
        self.health = Health(timeout=settings.health_timeout)
        """Readiness checks of this process: Redis, pub/sub, the loops of every role here."""
        self.store_guard = StoreGuard(self.redis, settings)
        """Start-up checks of the store; the ``redis`` readiness check."""
        self.health.add("redis", self.store_guard.ready)
        self.health.add("pubsub", self.hub.check_subscribed)
        self.health.add("fanout loops", self.hub.role_loops.check)
        self.health.add("index watch loops", self.index_watch.role_loops.check)
        console = Console(settings, lambda: self.port, auth_required=self.authenticator.enabled)
        self.tools = SessionTools(
            settings,
            self.log,
            self.index,
            self.hub,
            self.agents,
            tool_access(settings, self.authenticator),
        )
        """The session tools' operations (MCP and REST), on the ACP methods' command path."""
        self.streamable = streamable_http(
            settings, self.methods, self.redis, self.hub.node_id, self.access
        )
        """ACP's Streamable HTTP connections (``/acp`` on the HTTP port)."""
        self.hub.listener.http_bells = self.streamable.on_bell
        self.http = FrontHttp(
            settings,
            sessions_service(settings, self.redis, self.authenticator, self.pages),
            console,
            self.health,
            self.tools,
            EventStream(self.log, self.hub),
            AcpHttpEndpoint(
                self.streamable,
                self.authenticator,
                self.log,
                lambda host: websocket_only.websocket_url(settings, self.port, host),
            ),
        )
        self.http.websocket_port = lambda: self.port
        self.loops = self._loops()
        """The front's other loops (the fan-out hub and the index watch run their own)."""
        self.health.add("front loops", self.loops.check)

    def _loops(self) -> RoleLoops:
        """The keepalive, the Streamable HTTP leases' renewal and, with authentication, the
        credential watch: started once the front serves, stopped once it no longer does."""
        loops = RoleLoops("front")
        loops.add("keepalive", self.keepalive.run)
        loops.add("http-lease-renewal", self.streamable.renew)
        loops.add("presence", self.methods.presence.run)
        if self.authenticator.enabled:
            loops.add("credential-watch", self.credentials.run)
        return loops

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def http_port(self) -> int:
        """The HTTP listener's port: MCP at ``/mcp``, REST at ``/v1/…``."""
        return self.http.port

    reliable: set[ServerConnection]
    """The sockets speaking ACP Remote's reliable transport (their state is in the store)."""

    async def start(self) -> None:
        self.reliable = set()
        await self.store_guard.start()
        await self.hub.start()
        await self.index_watch.start()
        for role in self.colocated:
            await role.start()
        self._server = await serve(
            self._handle,
            self.settings.host,
            self.settings.port,
            process_request=self._process_request,
            process_response=self._process_response,
            create_connection=websocket_only.connection_class(self.settings, self._http_base),
            select_subprotocol=_select_subprotocol,
            ssl=tls_context(self.settings),
            max_size=self.settings.max_frame_bytes,
            # The socket is read on while frames wait for their pace; past this many queued,
            # requests are refused as they are read (:mod:`.acp.flow`): what still queues
            # (answers, notifications) stops reading only when it is this many more.
            max_queue=2 * waiting_bound(self.settings.rate_per_connection, self.settings.max_pace),
            ping_interval=None,  # self.keepalive pings
            ping_timeout=None,
            compression=None,
            # Clients of a node that went away all reconnect at once: a short accept queue
            # (asyncio's default is 100) overflows, and the kernel drops or resets them.
            # As Go's listeners do, ask for the most the kernel allows (net.core.somaxconn).
            backlog=socket.SOMAXCONN,
        )
        log.info(
            "acp-broker listening on ws://%s:%d%s",
            self.settings.host,
            self.port,
            self.settings.path,
        )
        await self.http.start()
        await self.loops.start()

    async def __aenter__(self) -> FrontNode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(hand_over=True)

    async def stop(self, *, hand_over: bool = False) -> None:
        """Stop accepting, tell clients to reconnect elsewhere, stop the roles.

        ``hand_over`` leaves this node's sessions RUNNING for another agent host to
        take over at once (a drain), instead of recording them as STOPPED.
        """
        if self._server is not None:
            self._server.close(close_connections=False)
            connections = list(self.connections)
            await asyncio.gather(*(conn.drain(self.settings.drain_timeout) for conn in connections))
            sockets = [conn.ws for conn in connections] + list(self.reliable)
            for ws in sockets:
                with contextlib.suppress(Exception):  # drained already; a broken one is gone
                    await ws.close(CLOSE_GOING_AWAY, "broker shutting down: reconnect")
            await self._server.wait_closed()
        await self._stop_part("the front's loops", self.loops.stop())
        await self.keepalive.stop()
        await self._stop_part("the Streamable HTTP connections", self.streamable.stop())
        await self._stop_part("the HTTP listener", self.http.stop())
        for role in reversed(self.colocated):
            name = getattr(role, "name", type(role).__name__)
            await self._stop_part(name, role.stop(hand_over=hand_over))
        await self._stop_part("the fan-out hub", self.hub.stop())
        await self._stop_part("the index watch", self.index_watch.stop())
        await self.store_guard.stop()
        self.list_changes.close()
        if self.archive is not None:
            await self.archive.close()
        self.index.close()
        self.log.close()
        if self._owns_redis:
            with contextlib.suppress(Exception):  # stopping: every write was awaited before
                await self.redis.aclose()

    async def _stop_part(self, name: str, stopping: Coroutine[Any, Any, None]) -> None:
        if not await stop_within(name, stopping, STOP_TIMEOUT):
            self.stalled_stops.append(name)

    async def _handle(self, ws: ServerConnection) -> None:
        conn_id = str(ws.id)
        principal = self._principals.pop(conn_id, None)
        _forget_handshake(ws)
        if ws.subprotocol == remote_frames.SUBPROTOCOL:
            await self._handle_reliable(ws, principal)
            return
        conn = ClientConnection(ws, self.methods, principal=principal, conn_id=conn_id)
        self.connections.add(conn)
        pinged = cast(websocket_only.WebSocketOnlyConnection, ws)  # see connection_class
        self.keepalive.add(pinged)
        pinged.frame_in = conn.frame_in
        metrics.CONNECTIONS.inc()
        try:
            await conn.run()
        finally:
            pinged.frame_in = None
            metrics.CONNECTIONS.dec()
            self.keepalive.discard(pinged)
            self.connections.discard(conn)
            self.list_changes.discard(conn)

    async def _handle_reliable(self, ws: ServerConnection, principal: Principal | None) -> None:
        """A socket that asked for ACP Remote's reliable transport (its connection lives in
        the store, as a Streamable HTTP one does): pinged as every socket, and counted once,
        as the connection it opens or resumes."""
        pinged = cast(websocket_only.WebSocketOnlyConnection, ws)  # see connection_class
        self.keepalive.add(pinged)
        self.reliable.add(ws)
        metrics.CONNECTIONS.inc()
        try:
            await ReliableWebSocket(self.streamable, ws, principal).run()
        finally:
            metrics.CONNECTIONS.dec()
            self.reliable.discard(ws)
            self.keepalive.discard(pinged)

    async def _process_request(
        self, ws: ServerConnection, request: HttpRequest
    ) -> HttpResponse | None:
        path = request.path.split("?", 1)[0]
        if path == self.settings.path:
            return await self._admit(ws, request)
        ops = await ops_response(ws, path, self.health)  # health and metrics
        if ops is not None:
            return ops
        # One HTTP path: REST, OpenAPI and MCP are the HTTP port's (its app answers them).
        text = websocket_only.elsewhere(self.settings, path, self._http_base())
        return ws.respond(http.HTTPStatus.NOT_FOUND, text)

    def _http_base(self) -> str:
        return http_url(self.settings, self.http_port)

    async def _admit(self, ws: ServerConnection, request: HttpRequest) -> HttpResponse | None:
        """Origin, credentials and connection limits of a WebSocket upgrade."""
        origin = request.headers.get("Origin")
        if (
            origin is not None
            and origin not in self.settings.allowed_origins
            and not same_origin_console(origin, request.headers.get("Host"), self.http.port)
        ):
            return ws.respond(http.HTTPStatus.FORBIDDEN, "origin not allowed\n")
        token, _ = websocket_token(
            request.headers.get("Authorization"),
            _offered_subprotocols(request),
            request.headers.get("Cookie"),
        )
        principal: Principal | None
        try:
            principal = await self.authenticator.authenticate(token)
        except AuthError:
            if token or not self.settings.allow_in_band_auth:
                response = ws.respond(http.HTTPStatus.UNAUTHORIZED, "unauthorized\n")
                response.headers["WWW-Authenticate"] = 'Bearer realm="acp-broker"'
                return response
            principal = None  # in-band: ACP authenticate will say who it is
        conn_id = str(ws.id)
        refusal = self.access.open_connection(conn_id, principal)
        if refusal is not None:
            return ws.respond(http.HTTPStatus.TOO_MANY_REQUESTS, refusal + "\n")
        self._principals[conn_id] = principal
        # The place is given back when the socket is gone, not when the handler ends: a
        # handshake that fails after this point (no Upgrade header, a bad key, a client
        # that hangs up) never reaches the handler.
        ws.connection_lost_waiter.add_done_callback(lambda _: self._gone(conn_id))
        return None

    def _gone(self, conn_id: str) -> None:
        self._principals.pop(conn_id, None)
        self.access.close_connection(conn_id)

    def _process_response(
        self, ws: ServerConnection, request: HttpRequest, response: HttpResponse
    ) -> None:
        if response.status_code == http.HTTPStatus.SWITCHING_PROTOCOLS:
            response.headers[CONNECTION_ID_HEADER] = str(ws.id)


def streamable_http(
    settings: Settings, methods: AcpMethods, redis: Store, node_id: str, access: Access
) -> StreamableHttp:
    """The Streamable HTTP connections of a front, on the store ``redis``."""
    links = HttpLinks(
        redis,
        retention=settings.http_retained_messages,
        idle_ms=int(settings.http_idle_timeout * 1000),
        lease_ms=int(settings.http_lease * 1000),
    )
    return StreamableHttp(settings, methods, links, node_id, access)


def _offered_subprotocols(request: HttpRequest) -> list[str]:
    return [
        item.strip()
        for value in request.headers.get_all("Sec-WebSocket-Protocol")
        for item in value.split(",")
        if item.strip()
    ]


def _select_subprotocol(ws: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """The reliable transport's subprotocol when offered (it selects that binding), else
    echo the credential subprotocol a browser offered (browsers require the echo)."""
    if remote_frames.SUBPROTOCOL in offered:
        return Subprotocol(remote_frames.SUBPROTOCOL)
    for protocol in offered:
        if protocol.startswith(SUBPROTOCOL_PREFIX):
            return protocol
    return None


def _loopback_only(settings: Settings) -> bool:
    return settings.host in ("127.0.0.1", "::1", "localhost")


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """Direct TLS from ``--tls-cert``/``--tls-key`` (usually the load balancer does TLS)."""
    if not settings.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context


def _forget_handshake(ws: ServerConnection) -> None:
    """Empty the handshake's headers once the connection is admitted: nothing reads them
    afterwards, and kept they would cost an idle connection ~3 KB for its whole life (and
    hold its credentials in memory).

    They are emptied in place, not dropped: websockets' parser keeps a reference to the
    request, and takes ``ws.request`` None to mean that the handshake has yet to arrive.
    """
    for message in (ws.request, ws.response):
        if message is not None:
            message.headers.clear()
