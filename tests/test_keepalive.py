"""Keepalive from one loop per front: live peers stay, a peer that stops answering is closed;
a closed connection leaves no reference cycle (it is freed as its last reference goes)."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets

from bench import wsclient
from broker import loops
from broker.front.acp.connection import ClientConnection
from broker.front.acp.keepalive import BATCH, MAX_WAIT, Keepalive, PingedConnection, slots
from broker.serve import Broker
from broker.store.client import connect

from .conftest import make_settings
from .support.client import RawClient, wait_for

INTERVAL = 0.2


@pytest.fixture
def store_kind() -> str:
    return "embedded"  # keepalive does not touch the store


@pytest.fixture
async def node(store: Any) -> AsyncIterator[Broker]:
    broker = Broker(make_settings(ping_interval=INTERVAL), redis=store)
    await broker.start()
    yield broker
    await broker.stop()


async def _client(node: Broker, **kwargs: Any) -> RawClient:
    return await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp", **kwargs)


def _server_side(node: Broker, client: RawClient) -> ClientConnection | None:
    conn_id = client.ws.response.headers["Acp-Connection-Id"]
    return next((c for c in node.connections if c.id == conn_id), None)


def _pinged(conn: ClientConnection) -> PingedConnection:
    assert isinstance(conn.ws, PingedConnection)
    return conn.ws


async def test_a_peer_that_stops_answering_is_closed_and_live_ones_stay(node: Broker) -> None:
    live = [await _client(node) for _ in range(3)]
    dead = await _client(node, ping_interval=None)
    dead_side = _server_side(node, dead)
    assert dead_side is not None
    dead.ws.transport.pause_reading()  # reads nothing more, so answers no Ping

    # Closed within the interval, the timeout and a tick (bounded here by 10 s).
    await wait_for(lambda: _server_side(node, dead) is None, 10, "the dead peer closed")
    assert node.keepalive.timed_out == 1
    assert _pinged(dead_side).pongs <= 1

    # The live ones answered ping after ping meanwhile and beyond, and are still here.
    sides = [_server_side(node, c) for c in live]
    assert all(side is not None for side in sides)
    await wait_for(lambda: all(_pinged(s).pongs >= 5 for s in sides if s), 10, "5 pongs each")
    assert all(_server_side(node, c) is not None for c in live)
    assert node.keepalive.timed_out == 1
    for client in live:
        assert "result" in await client.call("session/list", {})

    # What the dead peer finds once it reads again: the keepalive's Close frame (1011).
    dead.ws.transport.resume_reading()
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(dead.ws.recv(), 10)
    assert closed.value.rcvd is None or closed.value.rcvd.code == 1011
    for client in live:
        await client.close()


async def test_each_open_connection_sits_in_one_keepalive_slot_until_it_closes(
    node: Broker,
) -> None:
    keepalive = node.keepalive
    assert len(keepalive._slots) == slots(INTERVAL)
    clients = [await _client(node) for _ in range(4)]
    sides = [_server_side(node, c) for c in clients]
    # Each connection sits in one slot; it leaves it when it closes.
    members = [ws for slot in keepalive._slots for ws in slot]
    assert {id(_pinged(s)) for s in sides if s} <= {id(ws) for ws in members}
    await clients[0].close()
    await wait_for(lambda: _server_side(node, clients[0]) is None, 10, "closed")
    assert all(ws.protocol.state.name == "OPEN" for slot in keepalive._slots for ws in slot)
    assert sum(len(slot) for slot in keepalive._slots) == len(node.connections) == 3
    for client in clients[1:]:
        await client.close()


def test_a_burst_of_connections_is_dealt_over_every_slot() -> None:
    # Clients arrive in bursts; in the few slots visited meanwhile they would make a few
    # visits long (hundreds of Pings each) and leave the rest empty.
    keepalive = Keepalive(interval=1.0, timeout=1.0)
    count = len(keepalive._slots)
    burst = [PingedConnection.__new__(PingedConnection) for _ in range(3 * count)]
    for ws in burst:
        keepalive.add(ws)
    assert [len(slot) for slot in keepalive._slots] == [3] * count
    for ws in burst[::2]:
        keepalive.discard(ws)
    assert sum(len(slot) for slot in keepalive._slots) == len(burst[1::2])
    assert all(ws.keepalive_slot == -1 for ws in burst[::2])


async def test_a_closed_connection_is_freed_without_the_cyclic_collector(node: Broker) -> None:
    owner = await _client(node)
    session = (await owner.call("session/new", {"cwd": "/k", "mcpServers": []}))["result"]
    client = await _client(node)
    await client.call("session/resume", {"sessionId": session["sessionId"], "cwd": "/k"})
    side = _server_side(node, client)
    assert side is not None
    refs: list[weakref.ref[Any]] = [
        weakref.ref(side),
        weakref.ref(side.ws),
        weakref.ref(side.ws.protocol),
    ]
    del side
    gc.collect()
    gc.disable()  # from here only reference counts free anything
    try:
        await client.close()
        await wait_for(lambda: all(ref() is None for ref in refs), 10, "the connection freed")
    finally:
        gc.enable()
    await owner.close()


CHURN = 2_000
"""Connections opened and closed, in the ways clients end, by the churn test."""


def _frame(opcode: int, payload: bytes) -> bytes:
    return bytes((0x80 | opcode, 0x80 | len(payload))) + b"\x00" * 4 + payload


_ENDS = {
    "Close frame": _frame(8, (1000).to_bytes(2, "big")),
    "end of stream": b"",  # the TCP connection closed without a Close frame: a client gone
    "reset": b"",
    "protocol error": b"\x81\x02hi",  # unmasked
    "invalid UTF-8": _frame(1, b"\xff\xfe"),
}


async def _churn_one(url: str, end: str) -> None:
    got: asyncio.Queue[bytes] = asyncio.Queue()
    client = await wsclient.connect(url, on_text=got.put_nowait, timeout=10)
    client.send_text(
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
    )
    await asyncio.wait_for(got.get(), 10)
    assert client.transport is not None
    if end == "reset":
        client.transport.abort()
    elif _ENDS[end]:
        client.transport.write(_ENDS[end])
    else:
        client.close()
    await asyncio.wait_for(client.closed, 10)


async def _refused(port: int, request: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await asyncio.wait_for(reader.read(), 10)  # the answer, then the end of the stream
    writer.close()


async def _tracked_after_churn() -> tuple[int, int, int]:
    """Objects the collector tracks before and after CHURN connections came and went, with
    only reference counts freeing anything in between; and the connections still open."""
    node = Broker(make_settings(), redis=connect(None))
    await node.start()
    url = f"ws://127.0.0.1:{node.port}/acp"
    refusals = [
        b"POST /acp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",  # answered by us
        b"GET /acp HTTP/1.1\r\nHost: x\r\n\r\n",  # no Upgrade: websockets' handshake fails
    ]
    ends = list(_ENDS)

    async def churn(count: int) -> None:
        for i in range(count):
            if i % 10 == 9:
                await _refused(node.port, refusals[i // 10 % 2])
            else:
                await _churn_one(url, ends[i % len(ends)])
        await wait_for(lambda: not node.connections, 10, "every connection closed")

    try:
        async with asyncio.timeout(120):
            await churn(50)  # what the first of each kind makes once (caches, imports)
            gc.collect()
            gc.disable()  # from here only reference counts free anything
            try:
                before = len(gc.get_objects())
                await churn(CHURN)
                after = len(gc.get_objects())
            finally:
                gc.enable()
        return before, after, len(node.connections)
    finally:
        await node.stop()


def test_churning_connections_leaves_no_garbage_for_the_cyclic_collector() -> None:
    # On the loop a front runs on (uvloop; the standard loop's transports reference
    # themselves). A connection left in a cycle is ~16-50 tracked objects: 2,000 of them
    # would add 32,000 at least; the bound leaves room for the caches a loaded run fills
    # (505 has been seen under the suite: a quarter of an object a connection).
    before, after, still_open = loops.run(_tracked_after_churn(), "uvloop")
    assert still_open == 0
    assert after - before < 1000, f"{after - before} more tracked objects after {CHURN} connections"


def test_a_visit_takes_as_many_slots_as_hold_a_batch_of_connections() -> None:
    # A front with few connections wakes for a batch of Pings, not every tick for one.
    keepalive = Keepalive(interval=20.0, timeout=20.0)
    count = len(keepalive._slots)
    assert keepalive.span() == keepalive.max_span == round(MAX_WAIT / keepalive.tick)
    crowd = [PingedConnection.__new__(PingedConnection) for _ in range(count // 2)]
    for ws in crowd:
        keepalive.add(ws)
    assert keepalive.span() == 2 * BATCH  # 2 slots a connection: 20 in 40 slots
    more = [PingedConnection.__new__(PingedConnection) for _ in range(20 * count)]
    for ws in more:
        keepalive.add(ws)
    assert keepalive.span() == 1
    for ws in crowd + more:
        keepalive.discard(ws)
    assert keepalive.span() == keepalive.max_span


PIPELINED = 150
"""session/list requests a paced client sends at once (four seconds of its pace)."""
RATE = 25.0
"""The pace of the paced-client test: its first 50 requests pass, the rest wait."""


@pytest.fixture
async def paced_node(store: Any) -> AsyncIterator[Broker]:
    settings = make_settings(ping_interval=INTERVAL, rate_per_connection=RATE, max_pace=30.0)
    broker = Broker(settings, redis=store)
    await broker.start()
    yield broker
    await broker.stop()


async def test_a_client_pipelining_past_its_pace_is_slowed_and_never_cut_off(
    paced_node: Broker,
) -> None:
    # While the front paces a client it reads no more of its frames, so the client's Pongs
    # wait behind its requests, unread, for far longer than a ping timeout (0.2 s here).
    client = await _client(paced_node)
    side = _server_side(paced_node, client)
    assert side is not None
    frames = [
        f'{{"jsonrpc":"2.0","id":{n},"method":"session/list","params":{{}}}}'
        for n in range(PIPELINED)
    ]
    # Every frame written at once, as a pipelining client does; the client keeps reading
    # (so it answers Pings) while it waits for the answers.
    client.ws.transport.write(b"".join(_masked_text(frame) for frame in frames))
    answered: set[int] = set()

    async def read_all() -> None:
        while len(answered) < PIPELINED:
            reply = json.loads(await asyncio.wait_for(client.ws.recv(), 10))
            assert "result" in reply, reply
            answered.add(reply["id"])

    await asyncio.wait_for(read_all(), 60)
    assert answered == set(range(PIPELINED))
    assert paced_node.keepalive.timed_out == 0
    assert _server_side(paced_node, client) is not None  # still open
    assert _pinged(side).pongs >= 1  # and its Pongs were read once the backlog was
    assert "result" in await client.call("session/list", {})
    await client.close()


def _masked_text(text: str) -> bytes:
    """A client's text frame (masked with a zero key, which leaves the payload as it is)."""
    data = text.encode()
    assert len(data) < 126
    return bytes((0x81, 0x80 | len(data))) + b"\x00" * 4 + data


def test_an_overdue_pong_of_a_connection_held_back_by_pacing_gets_a_new_timeout() -> None:
    keepalive = Keepalive(interval=1.0, timeout=1.0)
    ws = PingedConnection.__new__(PingedConnection)
    keepalive.add(ws)
    ws.ping_sent = 0.0
    ws.reading_held(True, 0.5)
    for _ in range(len(keepalive._slots)):  # every slot visited, long past the timeout
        keepalive.visit(10.0)
    assert keepalive.timed_out == 0 and ws.ping_sent == 10.0
    # The hold ends: the Pong, read behind the requests, has a whole timeout from now.
    ws.reading_held(False, 11.0)
    assert ws.ping_sent == 11.0 and not ws.held
    ws.acknowledge_pings(b"acpb")
    assert ws.ping_sent is None and ws.pongs == 1


def test_a_peer_heard_from_since_the_ping_is_alive_and_gets_a_new_timeout() -> None:
    """Bytes from the peer since the Ping show it alive (its Pong may wait behind its own
    requests, or behind our replies it has yet to read); silence past the timeout closes."""
    keepalive = Keepalive(interval=1.0, timeout=1.0)
    ws = PingedConnection.__new__(PingedConnection)
    keepalive.add(ws)
    ws.ping_sent = 0.0
    ws.heard = True  # as data_received sets it
    for _ in range(len(keepalive._slots)):
        keepalive.visit(10.0)
    assert keepalive.timed_out == 0 and ws.ping_sent == 10.0 and not ws.heard
    silent = PingedConnection.__new__(PingedConnection)
    keepalive.add(silent)
    silent.ping_sent = 0.0
    assert not silent.heard
    closed: list[PingedConnection] = []
    keepalive._close = closed.append  # type: ignore[method-assign,assignment]
    ws.heard = True  # the first goes on sending
    for _ in range(len(keepalive._slots)):
        keepalive.visit(20.0)
    assert closed == [silent]
