"""Keepalive from one loop per front: live peers stay, a peer that stops answering is closed;
a closed connection leaves no reference cycle (it is freed as its last reference goes)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets

from broker.front.acp.connection import ClientConnection
from broker.front.acp.keepalive import Keepalive, PingedConnection, slots
from broker.serve import Broker

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
    client = await RawClient.connect(f"ws://127.0.0.1:{node.port}/acp", **kwargs)
    await client.initialize()
    return client


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
    refs = [weakref.ref(side), weakref.ref(side.ws), weakref.ref(side.ws.protocol)]
    del side
    gc.collect()
    gc.disable()  # from here only reference counts free anything
    try:
        await client.close()
        await wait_for(lambda: all(ref() is None for ref in refs), 10, "the connection freed")
    finally:
        gc.enable()
    await owner.close()
