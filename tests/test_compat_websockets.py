"""What broker/compat/websockets.py (and the outbox and keepalive beside it) assume of
websockets' internals: an upgrade that changes one fails here, by name."""

from __future__ import annotations

import inspect
import types

from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from broker.compat.websockets import HookedServerConnection, break_cycles


def test_connections_process_each_parsed_event_in_an_overridable_method() -> None:
    assert list(inspect.signature(Connection.process_event).parameters) == ["self", "event"]
    # data_received hands every event the protocol parsed to it, one at a time.
    assert "self.process_event(" in inspect.getsource(Connection.data_received)


def test_connections_acknowledge_pongs_in_an_overridable_method() -> None:
    assert list(inspect.signature(Connection.acknowledge_pings).parameters) == ["self", "data"]
    assert "self.acknowledge_pings(" in inspect.getsource(Connection.process_event)


async def test_a_connection_has_the_state_the_outbox_reads_before_writing_itself() -> None:
    ws = HookedServerConnection(ServerProtocol(), None)  # type: ignore[arg-type]
    assert ws.paused is False and ws.send_in_progress is None
    assert callable(ws.send_data) and list(inspect.signature(ws.send_data).parameters) == []
    assert ws.protocol.state is State.CONNECTING and ws.protocol.extensions == []
    assert "send_in_progress" in inspect.getsource(Connection.send)  # what it waits on


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
