"""What broker/compat/websockets.py (and the outbox and keepalive beside it) assume of
websockets' internals: an upgrade that changes one fails here, by name."""

from __future__ import annotations

import asyncio
import inspect
import types
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from broker.compat.websockets import HookedServerConnection, break_cycles

from .support.client import wait_for


class _Wire(asyncio.Transport):
    """A transport that keeps what a connection writes (no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return False


class _Recording(Connection):
    """websockets' own connection (a server's side, open), noting what its overridable
    methods are given."""

    def __init__(self) -> None:
        super().__init__(ServerProtocol(state=State.OPEN))
        self.events: list[Frame] = []
        self.acknowledged: list[bytes] = []

    def process_event(self, event: Any) -> None:
        self.events.append(event)
        super().process_event(event)

    def acknowledge_pings(self, data: bytes) -> None:
        self.acknowledged.append(data)
        super().acknowledge_pings(data)


def _opened() -> tuple[_Recording, _Wire]:
    ws, wire = _Recording(), _Wire()
    ws.connection_made(wire)
    return ws, wire


def _from_client(*frames: Frame) -> bytes:
    return b"".join(frame.serialize(mask=True, extensions=[]) for frame in frames)


async def test_connections_process_each_parsed_event_in_an_overridable_method() -> None:
    assert list(inspect.signature(Connection.process_event).parameters) == ["self", "event"]
    ws, _ = _opened()
    # Two frames in one read: data_received hands each to process_event, in order.
    ws.data_received(_from_client(Frame(Opcode.TEXT, b"{}"), Frame(Opcode.TEXT, b"[]")))
    assert [(f.opcode, f.data) for f in ws.events] == [(Opcode.TEXT, b"{}"), (Opcode.TEXT, b"[]")]


async def test_connections_acknowledge_pongs_in_an_overridable_method() -> None:
    assert list(inspect.signature(Connection.acknowledge_pings).parameters) == ["self", "data"]
    ws, wire = _opened()
    waiter = await ws.ping(b"mine")
    assert wire.written  # the ping went out
    ws.data_received(_from_client(Frame(Opcode.PONG, b"mine")))
    # process_event handed the pong's payload to acknowledge_pings, which answered the ping.
    assert ws.acknowledged == [b"mine"]
    async with asyncio.timeout(5):  # answered already: the bound only stops a hang
        assert await waiter >= 0  # the latency


async def test_a_connection_has_the_state_the_outbox_reads_before_writing_itself() -> None:
    ws = HookedServerConnection(ServerProtocol(), None)  # type: ignore[arg-type]
    assert ws.paused is False and ws.send_in_progress is None
    assert callable(ws.send_data) and list(inspect.signature(ws.send_data).parameters) == []
    assert ws.protocol.state is State.CONNECTING and ws.protocol.extensions == []


async def test_send_waits_while_a_send_is_in_progress() -> None:
    # The outbox writes frames itself only while send_in_progress is None, and marks its
    # own writes with it: websockets' send must wait on it rather than interleave a frame.
    ws, wire = _opened()
    ws.send_in_progress = asyncio.get_running_loop().create_future()
    sending = asyncio.create_task(ws.send("later"))
    for _ in range(5):  # a few turns of the loop: send is parked on the future
        await asyncio.sleep(0)
    assert not sending.done() and b"later" not in wire.written
    ws.send_in_progress.set_result(None)
    ws.send_in_progress = None
    async with asyncio.timeout(5):  # a few loop turns; the bound only stops a hang
        await sending
    assert wire.written.endswith(b"later")


async def test_a_fragmented_send_holds_send_in_progress_until_its_last_fragment() -> None:
    ws, wire = _opened()
    release = asyncio.Event()

    async def fragments() -> AsyncIterator[str]:
        yield "one"
        await release.wait()
        yield "two"

    sending = asyncio.create_task(ws.send(fragments()))
    await wait_for(lambda: b"one" in wire.written, what="the first fragment written")
    assert ws.send_in_progress is not None  # what the outbox sees, and stays off the wire
    release.set()
    async with asyncio.timeout(5):
        await sending
    assert ws.send_in_progress is None and b"two" in wire.written  # then an empty last one


async def test_a_hooked_connection_hands_on_whole_data_frames_and_its_own_pongs() -> None:
    ws = HookedServerConnection(ServerProtocol(), None)  # type: ignore[arg-type]
    told: list[Frame] = []

    def frame_in(frame: Frame) -> bool:
        told.append(frame)
        return True

    ws.frame_in = frame_in
    ws.process_event(Frame(Opcode.TEXT, b"{}"))
    assert [f.data for f in told] == [b"{}"]
    pongs: list[bytes] = []

    def pong_received(self: HookedServerConnection, data: bytes) -> bool:
        pongs.append(data)
        return True

    ws.pong_received = types.MethodType(pong_received, ws)  # type: ignore[method-assign]
    ws.acknowledge_pings(b"mine")
    assert pongs == [b"mine"]


async def test_what_break_cycles_reaches_into_is_there() -> None:
    protocol = ServerProtocol()
    assert inspect.isgenerator(protocol.parser)
    assert protocol.parser_exc is None and protocol.handshake_exc is None
    ws = HookedServerConnection(protocol, None)  # type: ignore[arg-type]
    assert ws.connection_exc is None
    # The handshake request keeps what failed it in a private attribute.
    assert "_exception" in vars(Request)
    ws.request = None
    break_cycles(ws)
    assert ws.frame_in is None and inspect.getgeneratorstate(protocol.parser) == "GEN_CLOSED"


def test_serve_makes_connections_of_a_class_it_is_given() -> None:
    assert issubclass(HookedServerConnection, ServerConnection)
    assert "create_connection" in inspect.signature(serve).parameters


def test_connections_take_bytes_and_the_end_of_the_stream_as_asyncio_protocols() -> None:
    # before_handshake and break_cycles hang on these two asyncio.Protocol callbacks.
    assert list(inspect.signature(Connection.data_received).parameters) == ["self", "data"]
    assert list(inspect.signature(Connection.connection_lost).parameters) == ["self", "exc"]


async def test_a_connection_can_be_failed_as_the_keepalive_fails_it() -> None:
    # keepalive._fail: protocol.fail(code, reason), send_data(), then the end of the stream
    # waited for on connection_lost_waiter within close_timeout.
    ws = HookedServerConnection(ServerProtocol(), None)  # type: ignore[arg-type]
    assert list(inspect.signature(ws.protocol.fail).parameters)[:2] == ["code", "reason"]
    assert ws.connection_lost_waiter.done() is False and ws.close_timeout == 10
