"""A client that pipelines thousands of requests on one connection is slowed, never cut off:
every request is answered once (``ok``, or -32005 for those read while more wait for the
connection's pace than it serves within ``max_pace``), its Pings are answered and its Pongs
read while its requests wait, and another client of the node is answered as fast as before.

The pipelining client is a websockets client with its own keepalive on (a Ping every 2 s, a
Pong awaited 60 s), reading its socket as fast as it can: a front that
stopped reading while pacing left its Pings unread behind the requests for minutes (10,000
requests at 50 a second) and the client closed the connection itself (1011, "keepalive ping
timeout")."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets

from broker.serve import Broker

from .conftest import make_settings
from .support.client import RawClient

BOUND = 240.0
"""Seconds one run may take: the replies of 50,000 requests on a machine other tests load
(alone: about 10 s)."""
PROBES = 20
"""Round trips of the other client, before and during."""


@pytest.fixture
def store_kind() -> str:
    return "redis"


@pytest.fixture
async def node(store: Any) -> AsyncIterator[Broker]:
    broker = Broker(make_settings(ping_interval=2.0), redis=store)  # the default pace: 50/s
    await broker.start()
    yield broker
    await broker.stop()


async def _latency(client: RawClient, count: int) -> float:
    """The median round trip of ``session/list`` on ``client``, in seconds."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        reply = await client.call("session/list", {})
        assert "result" in reply, reply
        times.append(time.perf_counter() - started)
        await asyncio.sleep(0.02)  # a user's pace, well within its connection's
    return statistics.median(times)


@pytest.mark.parametrize("requests", [10_000, 50_000])
async def test_pipelined_requests_are_all_answered_once_and_the_client_is_not_cut_off(
    node: Broker, requests: int
) -> None:
    url = f"ws://127.0.0.1:{node.port}/acp"
    other = await RawClient.initialized(url)
    before = await _latency(other, PROBES)
    # Its Pongs come back behind the replies it has yet to read, in this process's one
    # loop: a minute is the bound, not a guess (a front that stopped reading while pacing
    # left its Pings unanswered for 200 s at 10,000 requests).
    ws = await websockets.connect(url, ping_interval=2.0, ping_timeout=60.0, max_queue=None)
    init = {"protocolVersion": 1, "clientCapabilities": {}}
    await ws.send(json.dumps({"jsonrpc": "2.0", "id": -1, "method": "initialize", "params": init}))
    assert "result" in json.loads(await ws.recv())
    outcomes: dict[int, Any] = {}

    async def send_all() -> None:
        for n in range(requests):
            await ws.send(f'{{"jsonrpc":"2.0","id":{n},"method":"session/list","params":{{}}}}')

    async def read_all() -> None:
        while len(outcomes) < requests:
            reply = json.loads(await ws.recv())
            assert reply["id"] not in outcomes, reply  # each answered once
            outcomes[reply["id"]] = "ok" if "result" in reply else reply["error"]["code"]

    async with asyncio.timeout(BOUND):
        pipelining = asyncio.gather(send_all(), read_all())
        during = await _latency(other, PROBES)
        await pipelining
    counts = Counter(outcomes.values())
    assert set(outcomes) == set(range(requests))
    assert set(counts) <= {"ok", -32005}, counts
    assert counts["ok"] >= 100, counts  # the pace's burst at least
    assert node.keepalive.timed_out == 0
    # Still open, and served: the client's Pings were answered all along.
    await ws.send('{"jsonrpc":"2.0","id":"last","method":"session/list","params":{}}')
    assert json.loads(await asyncio.wait_for(ws.recv(), 30))["id"] == "last"
    # The other client is answered as fast as before (a front's event loop is shared: its
    # round trips may take a parse of a flood's frame longer, not a pace's wait).
    assert during <= max(4 * before, before + 0.25), (before, during)
    await ws.close()
    await other.close()


async def test_frames_with_no_request_piling_up_behind_paced_ones_close_the_connection(
    store: Any,
) -> None:
    """Requests past the backlog's bound are refused; what is never refused (notifications,
    answers) past ``max_queue_bytes`` closes the connection (1008), so no queue grows
    without end behind a paced request."""
    settings = make_settings(rate_per_connection=1.0, max_pace=0.0, max_queue_bytes=4096)
    broker = Broker(settings, redis=store)
    await broker.start()
    try:
        url = f"ws://127.0.0.1:{broker.port}/acp"
        ws = await websockets.connect(url, max_queue=None)
        init = {"protocolVersion": 1, "clientCapabilities": {}}
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
        )
        assert "result" in json.loads(await ws.recv())
        for n in range(1, 4):  # the burst (2), then one that waits a second for its pace
            await ws.send(f'{{"jsonrpc":"2.0","id":{n},"method":"session/list","params":{{}}}}')
        note = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "x" * 900}}
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with asyncio.timeout(30):
                for _ in range(200):
                    await ws.send(json.dumps(note))
                while True:
                    await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    finally:
        await broker.stop()
