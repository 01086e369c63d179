"""What broker/compat/uvicorn.py assumes of uvicorn's ``H11Protocol`` (not a public API): an
upgrade that changes one fails here, by name."""

from __future__ import annotations

import asyncio
import inspect

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from broker.compat.uvicorn import guarded_h11


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
    config = uvicorn.Config(app=lambda *a: None)
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
