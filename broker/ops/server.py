"""The operator's port of a role that runs alone (``acp-broker worker agent-host`` or
``projector``, setting ``metrics_port``): ``/metrics``, ``/livez``, ``/readyz``, ``/healthz``.

A front serves the same paths on its HTTP port. This listener is the ``websockets``
server's plain-HTTP answer (``process_request``), as the front's WebSocket port answers
health: no second HTTP stack in a worker.
"""

from __future__ import annotations

import email.utils
import http
import logging

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .health import Health
from .metrics import METRICS_PATH, exposition

log = logging.getLogger(__name__)


async def ops_response(ws: ServerConnection, path: str, health: Health) -> Response | None:
    """The answer to a GET of ``path`` when it is an operator's path (None otherwise)."""
    if path == METRICS_PATH:
        body, content_type = exposition()
        return _response(ws, 200, body, content_type)
    answer = await health.answer(path)
    if answer is None:
        return None
    return _response(ws, answer.status, answer.body, answer.content_type)


def _response(ws: ServerConnection, status: int, body: bytes, content_type: str) -> Response:
    code = http.HTTPStatus(status)
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
        ]
    )
    return Response(code.value, code.phrase, headers, body)


class OpsServer:
    """Serves the operator's paths on ``host``:``port`` (0: any free port)."""

    def __init__(self, health: Health, host: str, port: int) -> None:
        self.health = health
        self.host = host
        self.requested_port = port
        self._server: Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await serve(
            _refuse_upgrades, self.host, self.requested_port, process_request=self._answer
        )
        log.info("metrics and health on http://%s:%d%s", self.host, self.port, METRICS_PATH)

    async def _answer(self, ws: ServerConnection, request: Request) -> Response:
        path = request.path.split("?", 1)[0]
        response = await ops_response(ws, path, self.health)
        if response is None:
            return ws.respond(http.HTTPStatus.NOT_FOUND, f"{path}: not here\n")
        return response

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def _refuse_upgrades(ws: ServerConnection) -> None:
    """Never reached: every request is answered before any upgrade."""
    await ws.close()
