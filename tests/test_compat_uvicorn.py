"""What broker/compat/uvicorn.py assumes of uvicorn's ``H11Protocol`` and ``Server`` (not
public APIs): an upgrade that changes one fails here, by name."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
from collections.abc import Iterator
from typing import Any

import h11
import httpx2
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from broker.compat.uvicorn import EmbeddedServer, guarded_h11

from .support.client import wait_for


def test_the_protocol_has_the_hooks_the_guard_overrides() -> None:
    hooks = {
        "connection_made": ["self", "transport"],
        "data_received": ["self", "data"],
        "on_response_complete": ["self"],
        "connection_lost": ["self", "exc"],
    }
    for name, parameters in hooks.items():
        assert list(inspect.signature(getattr(H11Protocol, name)).parameters) == parameters, name


class _Transport(asyncio.Transport):
    closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name in ("sockname", "peername") else default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


async def test_the_protocol_keeps_its_h11_connection_loop_and_transport() -> None:
    config = uvicorn.Config(app=lambda *a: None, log_config=None)
    config.load()
    protocol = guarded_h11(0.05)(config, ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    assert isinstance(protocol.conn, h11.Connection) and protocol.conn.their_state is h11.IDLE
    assert protocol.loop is asyncio.get_running_loop() and protocol.transport is transport
    # What the guard does with them: no request head in time, the socket is closed.
    for _ in range(100):
        if transport.closed:
            break
        await asyncio.sleep(0.01)
    assert transport.closed
    protocol.connection_lost(None)


class _Hooked(uvicorn.Server):
    """uvicorn's own server, noting when it goes through the hooks EmbeddedServer overrides."""

    calls: list[str]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        self.calls = ["signals captured"]
        yield
        self.calls.append("signals released")

    async def main_loop(self) -> None:
        self.calls.append(f"main loop, started: {self.started}")
        self.should_exit = True  # the first on_tick says stop: uvicorn's loop ends on it
        await super().main_loop()
        self.calls.append("main loop ended")


async def test_serve_goes_through_the_hooks_the_embedded_server_overrides() -> None:
    # serve() enters capture_signals(), and runs main_loop() once serving, inside it;
    # main_loop() ends when on_tick(counter) says so.
    assert list(inspect.signature(uvicorn.Server.on_tick).parameters) == ["self", "counter"]
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(_no_app, log_config=None, lifespan="off", access_log=False)
    server = _Hooked(config)
    async with asyncio.timeout(10):  # a start and a stop on a loaded machine: well under
        await server.serve(sockets=[sock])
    assert server.calls == [
        "signals captured",
        "main loop, started: True",
        "main loop ended",
        "signals released",
    ]


async def _no_app(scope: dict, receive: object, send: Any) -> None:
    pass


async def test_the_embedded_server_serves_in_the_loop_and_stops_at_once() -> None:
    async def app(scope: dict, receive: object, send: Any) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, lifespan="off", access_log=False)
    server = EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started, what="the server started")
        async with httpx2.AsyncClient(timeout=10) as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
        assert response.status_code == 204 and "date" in response.headers
        server.exit()
        async with asyncio.timeout(2):  # not a tick of a second: the exit event wakes it
            await task
    finally:
        task.cancel()
