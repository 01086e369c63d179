"""What one request costs a front, and what one Redis call costs a Python process.

Not one of the five workloads: a breakdown behind ``bench list``. Sequential requests
from the lean client to one front (``serve --no-workers``):

* **no-op**: an unknown method (answered -32601): the WebSocket round trip and dispatch;
* **empty list**: ``session/list`` of a cwd with no sessions: plus one index read;
* **50-row list**: a full page of 50 rows.

For each: latency p50/p99 and the front's CPU time (user and system) per request. Then one
Redis call (GET) from this process: through the store's client (redis-py, the blocking
pool the broker uses) and over a bare asyncio connection with hiredis, CPU per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import hiredis

from bench import common, listing
from bench.acp import lean_acp_client

_BLOCK = 250
"""Requests sent to one front before the next system's turn (systems alternate in blocks,
so that the machine's drift hits them alike)."""


def _calls(client: Any) -> dict[str, Callable[[], Awaitable[Any]]]:
    async def noop() -> None:
        with contextlib.suppress(RuntimeError):  # -32601, as expected
            await client.request("nope/nope", {})

    return {
        "no-op (unknown method)": noop,
        "empty session/list": lambda: client.request("session/list", {"cwd": "/nowhere"}),
        "50-row session/list": lambda: client.request("session/list", {}),
    }


def _check_page(front: str, kind: str, reply: Any) -> None:
    """A 50-row page must hold 50 rows: a front of an earlier revision may not read the
    index as this tree writes it (its layout changed at 83d8570), and would time nothing."""
    if kind.startswith("50-row") and len(reply["sessions"]) != 50:
        raise SystemExit(f"{front} does not read this tree's index: its page held no rows")


async def _front_costs(fronts: dict[str, tuple[str, int]], count: int) -> list[list[Any]]:
    """Each request kind, ``count`` times to every front (name: (url, pid)), interleaved."""
    rows = []
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            name: await stack.enter_async_context(lean_acp_client(url))
            for name, (url, _) in fronts.items()
        }
        for kind in _calls(None):
            latencies: dict[str, list[float]] = {name: [] for name in fronts}
            cpu = {name: [0.0, 0.0] for name in fronts}
            for name, client in clients.items():  # warm-up
                call = _calls(client)[kind]
                _check_page(name, kind, await call())
                for _ in range(min(300, count)):
                    await call()
            for start in range(0, count, _BLOCK):
                for name, client in clients.items():
                    call, pid = _calls(client)[kind], fronts[name][1]
                    user, system = common.cpu_times(pid)
                    for _ in range(min(_BLOCK, count - start)):
                        began = time.perf_counter()
                        await call()
                        latencies[name].append((time.perf_counter() - began) * 1000)
                    user2, system2 = common.cpu_times(pid)
                    cpu[name][0] += user2 - user
                    cpu[name][1] += system2 - system
            for name in fronts:
                summary = common.latency_summary(latencies[name])
                per = 1e6 / count
                label = kind if name == "broker" else f"{kind} ({name})"
                rows.append(
                    [label, summary["p50"], summary["p99"], cpu[name][0] * per, cpu[name][1] * per]
                )
    return rows


class _Bare(asyncio.Protocol):
    """One Redis connection: commands packed and replies parsed by hiredis, nothing else."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader(encoding="utf-8")
        self.waiting: list[asyncio.Future[Any]] = []
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.waiting.pop(0).set_result(reply)

    def call(self, *args: str) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self.transport.write(hiredis.pack_command(args))  # type: ignore[arg-type]
        return future


async def _redis_costs(url: str, count: int) -> list[list[Any]]:
    from broker.store.client import commands, connect

    store = commands(connect(url))
    await store.set("bench:k", "v")
    host, _, port = url.split("//", 1)[1].split("/", 1)[0].partition(":")
    _, bare = await asyncio.get_running_loop().create_connection(_Bare, host, int(port))
    rows = []
    for name, call in (
        ("GET through the store's client (redis-py)", lambda: store.get("bench:k")),
        ("GET over a bare hiredis connection", lambda: bare.call("GET", "bench:k")),
    ):
        for _ in range(min(300, count)):
            await call()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(count):
            await call()
        rows.append(
            [
                name,
                (time.process_time() - cpu) / count * 1e6,
                (time.perf_counter() - wall) / count * 1e6,
            ]
        )
    bare.transport.close()
    await store.aclose()
    return rows


async def run(args: Any) -> None:
    count = 300 if args.quick else 5000
    with common.private_redis() as url:
        await listing.populate_redis(url, 1_000)
        async with contextlib.AsyncExitStack() as stack:
            nodes = await stack.enter_async_context(common.fronts(url, 1, "requests"))
            fronts = {"broker": (nodes[0].url, nodes[0].pid)}
            for rev in args.baseline:
                tree = common.baseline_tree(rev)
                pairs = await stack.enter_async_context(common.fronts_at(tree, url, 1, rev))
                fronts[f"broker@{rev}"] = pairs[0]
            front = await _front_costs(fronts, count)
        redis_rows = await _redis_costs(url, count)
    tables = [
        common.table(
            f"What a front spends per request ({count:,} sequential requests each)",
            ["request", "p50 ms", "p99 ms", "front user µs/req", "front system µs/req"],
            front,
        ),
        common.table(
            f"One Redis call from a Python process ({count:,} sequential GETs)",
            ["path", "CPU µs/call", "wall µs/call"],
            redis_rows,
        ),
    ]
    data = {"quick": args.quick, "front": front, "redis": redis_rows}
    common.report("requests", tables, data, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("requests", __doc__.splitlines()[0] if __doc__ else "")
    common.add_baseline(p)
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
