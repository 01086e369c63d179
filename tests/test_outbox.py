"""The outbox, fed frames with no socket: what it writes, when, and when it gives up."""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.protocol import State

from broker.front.acp.lifetime import Lifetime
from broker.front.acp.outbox import BURST, CLOSE_SLOW_CONSUMER, Outbox, frame_head, framed


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))


class FakeProtocol:
    state = State.OPEN
    extensions: list[Any] = []


class FakeWire:
    """What an outbox reads of a websockets connection, recording what it is given."""

    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.protocol = FakeProtocol()
        self.paused = False
        self.send_in_progress: Any = None
        self.sent: list[str] = []  # through websockets' own send (the queue's writer)
        self.closed: tuple[int, str] | None = None

    def send_data(self) -> None:
        pass

    async def send(self, message: str) -> None:
        self.sent.append(message)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


def _outbox(wire: FakeWire, max_queue_bytes: int = 1 << 20) -> Outbox:
    loop = asyncio.get_running_loop()
    return Outbox(wire, "c1", max_queue_bytes, loop, Lifetime(loop))


def _frames_of(data: bytes) -> list[str]:
    """The text frames in ``data``, as a client reads them (unmasked server frames)."""
    texts = []
    while data:
        assert data[0] == 0x81  # FIN, text
        size, at = data[1], 2
        if size == 126:
            size, at = int.from_bytes(data[2:4], "big"), 4
        elif size == 127:
            size, at = int.from_bytes(data[2:10], "big"), 10
        texts.append(data[at : at + size].decode())
        data = data[at + size :]
    return texts


def test_frame_heads_follow_rfc_6455_lengths() -> None:
    assert frame_head(125) == b"\x81\x7d"
    assert frame_head(126) == b"\x81\x7e\x00\x7e"
    assert frame_head(65536) == b"\x81\x7f" + (65536).to_bytes(8, "big")
    assert _frames_of(framed(b"x" * 70000)) == ["x" * 70000]


async def test_a_reply_is_written_at_once_while_the_socket_keeps_up() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    outbox.send_text('{"id":1}')
    assert _frames_of(b"".join(wire.transport.writes)) == ['{"id":1}']
    assert wire.sent == [] and outbox.queued_bytes == 0


async def test_event_frames_of_one_step_are_written_together_after_it() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    outbox.send_text("e1", shared=True)
    outbox.send_text("e2", shared=True)
    assert wire.transport.writes == []  # corked until this step's work is done
    await asyncio.sleep(0)
    assert [_frames_of(w) for w in wire.transport.writes] == [["e1", "e2"]]


async def test_a_reply_after_corked_events_goes_after_them() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    outbox.send_text("event", shared=True)
    outbox.send_text("reply")
    assert _frames_of(b"".join(wire.transport.writes)) == ["event", "reply"]


async def test_an_event_alone_in_its_step_is_written_at_once() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    outbox.send_text("alone", shared=True, alone=True)
    assert _frames_of(b"".join(wire.transport.writes)) == ["alone"]


async def test_send_event_writes_what_send_text_of_a_shared_frame_does() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    outbox.send_event("e1")
    outbox.send_event("e2", alone=True)  # corked frames wait: it joins them
    assert wire.transport.writes == []
    await asyncio.sleep(0)
    outbox.send_event("e3", alone=True)
    assert [_frames_of(w) for w in wire.transport.writes] == [["e1", "e2"], ["e3"]]


async def test_send_event_behind_a_backed_up_socket_queues_in_order() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    wire.paused = True
    outbox.send_event("e1", alone=True)
    wire.paused = False
    outbox.send_event("e2", alone=True)  # behind the queue, never before it
    for _ in range(10):
        await asyncio.sleep(0)
    assert wire.sent == ["e1", "e2"] and wire.transport.writes == []
    outbox.send_event("e3", alone=True)  # the queue is gone: straight to the socket again
    assert _frames_of(b"".join(wire.transport.writes)) == ["e3"]


async def test_behind_a_backed_up_socket_frames_queue_and_go_in_order() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    wire.paused = True
    for n in range(3):
        outbox.send_text(f"f{n}")
    assert wire.transport.writes == [] and outbox.queued_bytes == 6
    wire.paused = False
    outbox.send_text("f3")  # behind the queue, never before it
    for _ in range(10):
        await asyncio.sleep(0)
    assert wire.sent == ["f0", "f1", "f2", "f3"] and outbox.queued_bytes == 0


async def test_a_client_that_lets_the_queue_overflow_is_closed_as_a_slow_consumer() -> None:
    wire = FakeWire()
    outbox = _outbox(wire, max_queue_bytes=1024)
    wire.paused = True
    for _ in range(3):
        outbox.send_text("x" * 400)
    await asyncio.sleep(0)
    assert wire.closed is not None and wire.closed[0] == CLOSE_SLOW_CONSUMER
    assert outbox.closing and outbox.queued_bytes == 0
    outbox.send_text("after")
    assert wire.sent == [] and wire.transport.writes == []


async def test_a_run_of_events_is_written_a_burst_at_a_time() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    texts = [f"r{n}" for n in range(BURST + 3)]
    outbox.send_run(iter(texts))
    assert len(wire.transport.writes) == 2
    assert [t for w in wire.transport.writes for t in _frames_of(w)] == texts


async def test_an_encoded_reply_is_framed_around_its_parts() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    outbox.send_encoded((b'{"id":1,"result":', b'{"sessions":[]}', b"}"))
    assert _frames_of(b"".join(wire.transport.writes)) == ['{"id":1,"result":{"sessions":[]}}']


async def test_a_frame_that_cannot_be_encoded_is_dropped_not_raised() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    outbox.send_text("bad \ud800")
    outbox.send_text("good")
    assert _frames_of(b"".join(wire.transport.writes)) == ["good"]


async def test_nothing_is_written_once_closed() -> None:
    wire = FakeWire()
    outbox = _outbox(wire)
    assert outbox.close() is None
    outbox.send_text("late")
    assert wire.transport.writes == []
