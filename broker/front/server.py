"""The front node: the WebSocket endpoint, health, and the roles it runs beside it.

:class:`Broker` wires the parts together. ``serve`` runs the front and, unless
told otherwise, the agent host and the projector in the same process, so one
node works out of the box.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http
import logging
import socket
import ssl
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.typing import Subprotocol

from workers.agent_host.worker import HostWorker
from workers.projector.worker import Projector

from ..auth.authenticator import (
    SUBPROTOCOL_PREFIX,
    Authenticator,
    websocket_token,
)
from ..auth.principal import AuthError, Principal
from ..config import Settings
from ..logs import install_redaction
from ..signals import until_stopped
from ..store.client import Store, connect, embedded_warning
from ..store.cursors import CursorCodec
from ..store.index import SessionIndex
from ..store.log import SessionLog
from .access import Access
from .connection import CLOSE_GOING_AWAY, ClientConnection
from .gateway import RemoteAgents
from .http import FrontHttp, http_url
from .hub import FanoutHub
from .methods import AcpMethods
from .routing import NodeRouter
from .sessions import sessions_service

log = logging.getLogger(__name__)

CONNECTION_ID_HEADER = "Acp-Connection-Id"


class Broker:
    """One broker process: front node plus, by default, an agent host and a projector."""

    def __init__(self, settings: Settings, *, redis: Store | None = None) -> None:
        self.settings = settings
        install_redaction()
        if redis is None and settings.redis_url is None:
            log.warning("%s", embedded_warning())
        self._owns_redis = redis is None
        self.redis = redis if redis is not None else connect(settings.redis_url)
        self.log = SessionLog(self.redis, feed_maxlen=settings.feed_maxlen)
        self.index = SessionIndex(self.redis)
        self.hub = FanoutHub(self.redis, self.log)
        self.agents = RemoteAgents(
            self.redis,
            settings.agent_list(),
            reply_channel=self.hub.node_channel,
            ack_timeout=settings.ack_timeout,
        )
        self.hub.listener = NodeRouter(self.redis, self.hub, self.agents)
        self.worker = HostWorker(self.redis, settings) if settings.workers else None
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
        )
        self.http = FrontHttp(settings, sessions_service(settings, self.redis, self.authenticator))
        self._principals: dict[str, Principal | None] = {}
        self.connections: set[ClientConnection] = set()
        self._server: Server | None = None
        self._projector: asyncio.Task[Any] | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def http_port(self) -> int:
        """The HTTP listener's port: MCP at ``/mcp``, REST at ``/v1/…``."""
        return self.http.port

    async def start(self) -> None:
        await self.hub.start()
        if self.worker is not None:
            self._projector = asyncio.create_task(Projector(self.redis).run(), name="projector")
            await self.worker.start()
        self._server = await serve(
            self._handle,
            self.settings.host,
            self.settings.port,
            process_request=self._process_request,
            process_response=self._process_response,
            select_subprotocol=_select_subprotocol,
            ssl=tls_context(self.settings),
            max_size=self.settings.max_frame_bytes,
            ping_interval=self.settings.ping_interval,
            ping_timeout=self.settings.ping_interval,
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

    async def stop(self, *, hand_over: bool = False) -> None:
        """Stop accepting, tell clients to reconnect elsewhere, stop the roles.

        ``hand_over`` leaves this node's sessions RUNNING for another agent host to
        take over at once (a drain), instead of recording them as STOPPED.
        """
        if self._server is not None:
            self._server.close(close_connections=False)
            connections = list(self.connections)
            await asyncio.gather(*(conn.drain(self.settings.drain_timeout) for conn in connections))
            for conn in connections:
                with contextlib.suppress(Exception):
                    await conn.ws.close(CLOSE_GOING_AWAY, "broker shutting down: reconnect")
            await self._server.wait_closed()
        await self.http.stop()
        if self.worker is not None:
            await self.worker.stop(hand_over=hand_over)
        if self._projector is not None:
            self._projector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._projector
        await self.hub.stop()
        self.index.close()
        if self._owns_redis:
            with contextlib.suppress(Exception):
                await self.redis.aclose()

    async def _handle(self, ws: ServerConnection) -> None:
        principal = self._principals.pop(str(ws.id), None)
        _forget_handshake(ws)
        conn = ClientConnection(ws, self.methods, principal=principal)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            self.access.close_connection(principal)

    async def _process_request(
        self, ws: ServerConnection, request: HttpRequest
    ) -> HttpResponse | None:
        path = request.path.split("?", 1)[0]
        if path == self.settings.path:
            return await self._admit(ws, request)
        return await self.http.answer_websocket_request(request)  # /healthz, /v1/…

    async def _admit(self, ws: ServerConnection, request: HttpRequest) -> HttpResponse | None:
        """Origin, credentials and connection limits of a WebSocket upgrade."""
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self.settings.allowed_origins:
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
        refusal = self.access.open_connection(principal)
        if refusal is not None:
            return ws.respond(http.HTTPStatus.TOO_MANY_REQUESTS, refusal + "\n")
        self._principals[str(ws.id)] = principal
        return None

    def _process_response(
        self, ws: ServerConnection, request: HttpRequest, response: HttpResponse
    ) -> None:
        if response.status_code == http.HTTPStatus.SWITCHING_PROTOCOLS:
            response.headers[CONNECTION_ID_HEADER] = str(ws.id)


def _offered_subprotocols(request: HttpRequest) -> list[str]:
    return [
        item.strip()
        for value in request.headers.get_all("Sec-WebSocket-Protocol")
        for item in value.split(",")
        if item.strip()
    ]


def _select_subprotocol(ws: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """Echo the credential subprotocol a browser offered (browsers require the echo)."""
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


async def run_broker(settings: Settings) -> None:
    """Run a broker until SIGINT or SIGTERM."""
    broker = Broker(settings)
    await broker.start()
    # What start-up made (modules, settings, the app) lives as long as the process: keep it
    # out of the collector's way, so that a full collection, which bursts of events set off,
    # walks only what the traffic made (a 10,000-event replay: 24k -> 37k events/s).
    gc.freeze()
    print(
        f"acp-broker ready on ws://{settings.host}:{broker.port}{settings.path}"
        f" and {http_url(settings, broker.http_port)} (MCP /mcp, REST /v1/sessions)",
        flush=True,
    )
    await until_stopped()
    await broker.stop(hand_over=True)
