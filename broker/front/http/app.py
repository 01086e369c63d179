"""The broker's HTTP listener: MCP at ``/mcp``, the REST endpoints, and the web console at ``/``.

MCP's streamable HTTP transport needs POST, which the WebSocket server cannot take,
so a node runs a second listener (setting ``http_port``): an ASGI app from the
``mcp`` SDK, served by uvicorn in the node's event loop. It also answers
``/v1/sessions`` and ``/v1/openapi.json`` (:class:`~.rest.RestApi`), and health
(``/livez``, ``/readyz``, ``/healthz``: :mod:`broker.ops.health`).
This is the only HTTP path: the WebSocket port answers ``/acp`` and health, and
points a request for anything else here (:func:`broker.front.node.FrontNode`).

The MCP endpoint is stateless (no MCP session is kept between requests), so any node
can answer any request, like every other part of the front.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from ...compat.uvicorn import EmbeddedServer, guarded_h11
from ...config import Settings
from ...ops.health import HEALTH_PATHS, Health
from ...ops.metrics import METRICS_PATH, exposition
from ..acp import websocket_only
from .console import Console
from .event_stream import EventStream
from .mcp import http_base as mcp_http_base
from .mcp import mcp_server
from .rest import PATHS, RestApi
from .session_routes import SessionRoutes
from .session_tools import SessionTools, request_base
from .sessions import SessionsService

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
START_TIMEOUT = 10.0
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class FrontHttp:
    """The HTTP port: MCP, REST, OpenAPI and health, all through one Starlette app."""

    def __init__(
        self,
        settings: Settings,
        sessions: SessionsService,
        console: Console | None = None,
        health: Health | None = None,
        tools: SessionTools | None = None,
        stream: EventStream | None = None,
        acp: ASGIApp | None = None,
    ) -> None:
        """``acp``: the app of ACP's Streamable HTTP transport at ``/acp`` (None: ``/acp``
        answers 404 naming the WebSocket URL)."""
        self.settings = settings
        self.acp = acp
        self.console = console
        self.health = health or Health()
        self.rest = RestApi(sessions, creates=tools is not None)
        self.tools = tools
        self.session_routes = (
            SessionRoutes(tools, stream) if tools is not None and stream is not None else None
        )
        self.mcp = mcp_server(
            sessions, tools, lambda ctx: request_base(settings, mcp_http_base(ctx))
        )
        self._server: EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._port: int | None = None
        self.websocket_port: Callable[[], int] = lambda: self.settings.port
        """The WebSocket port (the node sets it once bound), named by ``/acp`` here."""

    @property
    def port(self) -> int:
        """The HTTP port actually bound (``http_port`` 0 picks a free one)."""
        assert self._port is not None, "the HTTP listener is not started"
        return self._port

    def asgi_app(self) -> Starlette:
        """The HTTP port's app: the SDK's streamable HTTP app, the console, health, metrics and
        the REST routes."""
        routes: list[Route] = [
            Route(path, self._health_endpoint, methods=["GET"]) for path in HEALTH_PATHS
        ]
        if self.session_routes is not None:  # before the REST routes: they answer the rest
            routes += self.session_routes.routes()
        routes.append(Route(METRICS_PATH, _metrics_endpoint, methods=["GET"]))
        routes += [Route(path, self._rest_endpoint, methods=_ALL_METHODS) for path in PATHS]
        acp = self.acp if self.acp is not None else self._acp_endpoint
        routes.append(Route(self.settings.path, acp, methods=_ALL_METHODS))
        routes.append(Route("/{path:path}", self._rest_endpoint, methods=_ALL_METHODS))
        app = self.mcp.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            host=self.settings.host,
            custom_starlette_routes=routes,
        )
        if self.console is not None:  # before the catch-all that answers unknown paths
            app.router.routes[0:0] = self.console.routes()
        if self.settings.allowed_origins:  # browsers on these origins may call REST and MCP
            app.add_middleware(
                CORSMiddleware,
                allow_origins=self.settings.allowed_origins,
                allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                allow_headers=[
                    "Authorization",
                    "Content-Type",
                    "Mcp-Session-Id",
                    "Mcp-Protocol-Version",
                    "Last-Event-Id",
                    "Idempotency-Key",
                    "Acp-Connection-Id",
                    "Acp-Session-Id",
                ],
                expose_headers=[
                    "Link",
                    "Location",
                    "Mcp-Session-Id",
                    "WWW-Authenticate",
                    "Acp-Connection-Id",
                ],
            )
        return app

    async def _acp_endpoint(self, request: Request) -> Response:
        """ACP is not served on this port: say where it is."""
        url = websocket_only.websocket_url(
            self.settings, self.websocket_port(), request.headers.get("host")
        )
        body = websocket_only.refusal(url, http_url(self.settings, self.port))
        return Response(body, 404, media_type="text/plain")

    async def _health_endpoint(self, request: Request) -> Response:
        answer = await self.health.answer(request.url.path)
        assert answer is not None  # routed here for the health paths only
        return Response(answer.body, answer.status, media_type=answer.content_type)

    async def _rest_endpoint(self, request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        answer = await self.rest.answer(request.method, target, request.headers)
        return Response(answer.body, answer.status, headers=dict(answer.headers))

    async def start(self) -> None:
        """Bind ``host``:``http_port`` and serve until :meth:`stop`."""
        family = socket.AF_INET6 if ":" in self.settings.host else socket.AF_INET
        address = (self.settings.host, self.settings.http_listen_port())
        sock = socket.create_server(address, family=family, backlog=socket.SOMAXCONN)
        self._port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.asgi_app(),
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            http=guarded_h11(self.settings.http_header_timeout),
            ws="none",  # WebSocket is the ACP port's: an upgrade here is told so (/acp)
            timeout_keep_alive=self.settings.http_keep_alive_timeout,
            ssl_certfile=self.settings.tls_cert,
            ssl_keyfile=self.settings.tls_key,
        )
        self._server = EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http")
        await self._wait_started()
        log.info("acp-broker HTTP on %s (MCP at %s)", http_url(self.settings, self.port), MCP_PATH)

    async def _wait_started(self) -> None:
        assert self._server is not None and self._task is not None
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT
        while not self._server.started:
            if self._task.done():
                with contextlib.suppress(SystemExit):  # uvicorn exits on a failed start
                    self._task.result()
                raise RuntimeError("the HTTP listener stopped while starting (see the log)")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError("the HTTP listener did not start in time")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, finish what is in flight (bounded), stop the MCP app."""
        if self._server is None or self._task is None:
            return
        self._server.exit()
        with contextlib.suppress(asyncio.CancelledError, SystemExit):
            await self._task
        if self.tools is not None:
            await self.tools.close()
        self._server = self._task = None


async def _metrics_endpoint(request: Request) -> Response:
    body, content_type = exposition()
    return Response(body, 200, headers={"Content-Type": content_type})


def _host(settings: Settings) -> str:
    return f"[{settings.host}]" if ":" in settings.host else settings.host


def http_url(settings: Settings, port: int) -> str:
    """The base URL of the HTTP listener."""
    return f"http://{_host(settings)}:{port}"
