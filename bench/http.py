"""``python -m bench http``: deliveries over Streamable HTTP beside WebSocket ones.

One front (``serve --no-workers``), one agent host and a private Redis. S sessions, each
watched by W clients of one transport at a time: over WebSocket (``initialize`` +
``session/resume``), then over Streamable HTTP (``POST initialize``, the session's ``GET``
stream, ``POST session/resume``). This process appends ``agent_message_chunk`` updates to
the sessions (as an agent host does, ``SessionLog.append_many``), round robin, first at a
fixed rate, then as fast as it goes (batches of 64), each for ``--seconds``. Every update
carries its send time; a watcher's latency is its receive time minus that.

Per transport and phase: deliveries per second, p50/p99 latency, and CPU per delivery of
the front and of Redis (user+system time over the phase divided by deliveries): an HTTP
delivery is also an append to the connection's stream in Redis and a read from it, so
Redis' share is part of its price. The watchers run in this process (one event loop), the
same for both transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import websockets

from bench import common
from bench.acp import new_sessions
from bench.fanout import CWD, broker_feeder, feed

TRANSPORTS = ("ws", "http")


def _request(msg_id: int, method: str, params: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})


async def _until(condition: Any, seconds: float) -> None:
    """Wait (bounded) until ``condition()``: the watchers append from their own tasks."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)


def _latency(message: Any, into: list[float]) -> None:
    """Record the latency of an update message (its text is ``ts=<send time>``)."""
    if not isinstance(message, dict) or message.get("method") != "session/update":
        return
    content = message["params"]["update"].get("content") or {}
    text = content.get("text", "")
    if text.startswith("ts="):
        into.append((time.time() - float(text[3:])) * 1000)


async def ws_watcher(url: str, session_id: str, into: list[float], ready: Any) -> None:
    async with websockets.connect(url, max_size=None) as ws:
        init = {"protocolVersion": 1, "clientCapabilities": {}}
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        )
        await ws.recv()
        params = {"sessionId": session_id, "cwd": CWD}
        await ws.send(_request(2, "session/resume", params))
        while True:
            message = json.loads(await ws.recv())
            if message.get("id") == 2:
                ready()
                continue
            _latency(message, into)


async def http_watcher(
    http: aiohttp.ClientSession, base: str, session_id: str, into: list[float], ready: Any
) -> None:
    url = base + "/acp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    async with http.post(url, json=init) as response:
        conn_id = response.headers["Acp-Connection-Id"]
    headers = {"Acp-Connection-Id": conn_id, "Acp-Session-Id": session_id}
    stream_headers = {**headers, "Accept": "text/event-stream"}
    async with http.get(url, headers=stream_headers, timeout=aiohttp.ClientTimeout()) as stream:
        params = {"sessionId": session_id, "cwd": CWD}
        resume = {"jsonrpc": "2.0", "id": 2, "method": "session/resume", "params": params}
        async with http.post(url, json=resume, headers=headers) as response:
            assert response.status == 202, response.status
        async for line in stream.content:
            if not line.startswith(b"data:"):
                continue
            message = json.loads(line[5:])
            if message.get("id") == 2:
                ready()
                continue
            _latency(message, into)


@contextlib.asynccontextmanager
async def watching(
    transport: str, ws_url: str, http_base: str, rooms: list[str], watchers: int
) -> AsyncIterator[list[float]]:
    """Every watcher of ``transport`` joined; yields the list their latencies go to."""
    into: list[float] = []
    joined = asyncio.Event()
    count = 0
    total = len(rooms) * watchers

    def ready() -> None:
        nonlocal count
        count += 1
        if count == total:
            joined.set()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = []
        for room in rooms:
            for _ in range(watchers):
                if transport == "ws":
                    coro = ws_watcher(ws_url, room, into, ready)
                else:
                    coro = http_watcher(http, http_base, room, into, ready)
                tasks.append(asyncio.create_task(coro))
        try:
            await asyncio.wait_for(joined.wait(), 120)
            yield into
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def phase(
    send: Any,
    rooms: list[str],
    into: list[float],
    pids: dict[str, int],
    rate: float | None,
    seconds: float,
    expected_per_update: int,
) -> dict[str, Any]:
    into.clear()
    cpu0 = {name: common.cpu_seconds(pid) for name, pid in pids.items()}
    start = time.monotonic()
    count = int(rate * seconds) if rate else 10**9
    sent = await feed(send, rooms, count, rate, seconds)
    expected = sent * expected_per_update
    await _until(lambda: len(into) >= expected, 30)
    elapsed = time.monotonic() - start
    delivered = len(into)
    cpu = {name: common.cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    return {
        "rate": rate or "max",
        "sent": sent,
        "delivered": delivered,
        "lost": expected - delivered,
        "deliveries_per_s": delivered / elapsed,
        **common.latency_summary(into),
        "front_cpu_us_per_delivery": cpu["front"] / delivered * 1e6 if delivered else None,
        "redis_cpu_us_per_delivery": cpu["redis"] / delivered * 1e6 if delivered else None,
    }


async def run(args: Any) -> None:
    results: dict[str, list[dict[str, Any]]] = {}
    with common.private_redis() as redis_url:
        port = common.free_port()
        env = {"ACP_BROKER_HTTP_PORT": str(port)}
        async with (
            common.agent_host(redis_url, "http"),
            common.fronts(redis_url, 1, "http", env=env) as nodes,
        ):
            front = nodes[0]
            rooms = await new_sessions(front.url, args.sessions, CWD)
            pids = {"front": front.pid, "redis": common.redis_pid(redis_url) or front.pid}
            send, close = await broker_feeder(redis_url)
            try:
                for transport in args.transports.split(","):
                    base = f"http://127.0.0.1:{port}"
                    async with watching(transport, front.url, base, rooms, args.watchers) as into:
                        await feed(send, rooms, 2 * len(rooms), None, 30)  # warm-up
                        await _until(lambda: len(into) >= 2 * len(rooms) * args.watchers, 30)
                        runs = []
                        for rate in (args.rate, None):
                            runs.append(
                                await phase(
                                    send, rooms, into, pids, rate, args.seconds, args.watchers
                                )
                            )
                        results[transport] = runs
            finally:
                await close()
    headers = [
        "transport",
        "rate",
        "deliv/s",
        "p50 ms",
        "p99 ms",
        "front µs/deliv",
        "redis µs/deliv",
        "lost",
    ]
    rows = [
        [
            t,
            r["rate"],
            r["deliveries_per_s"],
            r.get("p50"),
            r.get("p99"),
            r["front_cpu_us_per_delivery"],
            r["redis_cpu_us_per_delivery"],
            r["lost"],
        ]
        for t, runs in results.items()
        for r in runs
    ]
    title = f"HTTP vs WebSocket deliveries: S={args.sessions} W={args.watchers}"
    common.report(
        "http",
        [common.table(title, headers, rows)],
        {"quick": args.quick, "results": results},
        args.out,
    )


def main(argv: list[str] | None = None) -> None:
    p = common.parser("http", __doc__ or "")
    p.add_argument("--sessions", type=int, default=10)
    p.add_argument("--watchers", type=int, default=10, help="per session and transport")
    p.add_argument("--rate", type=float, default=200.0, help="updates/s of the fixed-rate phase")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--transports", default=",".join(TRANSPORTS), help="ws,http or one of them")
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.watchers, args.seconds = 4, 5, 2.0
    asyncio.run(run(args))
