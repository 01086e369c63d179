"""Fan-out: S sessions, W watchers each over 2 front nodes, updates at a fixed rate and at max.

Systems, each in the same run and on the same client swarm (``bench/swarm.py``, two
processes of lean WebSocket clients):

* **broker**: 2 front nodes (``serve --no-workers``), one agent host; the sessions are made
  with ``session/new``; each watcher sends ``initialize`` + ``session/resume``. The updates
  go through the append path: this process acts as the agent host and appends each
  ``agent_message_chunk`` with ``SessionLog.append_many`` (64 a call at max; the Lua script:
  XADD, snapshot, feed, SPUBLISH per event), as an agent host does with what its agent
  says. A ``--baseline`` broker's fronts are that revision's, and so are the append scripts
  its updates go through (the Python side of the appends is this tree's).
* **socketio** (the peer): 2 python-socketio nodes (aiohttp) with ``AsyncRedisManager``;
  watchers join a room per session; updates are emitted to the room from a write-only
  manager (Redis PUBLISH).
* **relay** (the ceiling): 2 bare relays, Redis PUBLISH → ``websockets.broadcast``.

Every update carries its send time (``ts=<unix time>`` in its text); a watcher's latency is
its receive time minus that. CPU per delivery is the user+system time of the 2 server
processes over the run divided by the messages delivered. Each run also records how busy
the machine was (``machine_cores``) and how much of that was processes outside this run
(``others_cores``: other work on a shared machine), and with ``BENCH_TRACE=1`` in the
environment, per swarm process, each update's first and last arrival (``trace``: a list of
``[stamp, first, last, count]`` per swarm, unix times) to find which updates made a tail.
``--slices N`` (default 10) interleaves the runs of a round, the fixed-rate ones and the max
ones alike (see :func:`measure`): each system's run goes in N turns, the systems taking
turns. The max runs are interleaved too because on a shared machine the same code's CPU per
event moves 25-50% between windows tens of seconds apart: one 2-3 s max window per system
let that drift, not the code, decide a ratio such as max deliv/s ÷ relay (S=1000/W=2, 7
rounds: 0.74-1.13). A sliced run's delivered/s is its deliveries over the sum of its slices'
durations, each from the slice's first send to its last delivery (with one slice: first send
to last delivery, as before); every slice waits for its deliveries, so a loss is still
counted, and the p99 and CPU per delivery are over all the slices together. Each result
also lists its slices (``slices``: ``[sent, delivered, seconds]`` each).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import common

if TYPE_CHECKING:
    from broker.store.events import JsonObject
    from broker.store.log import SessionLog
from bench.acp import new_sessions

SYSTEMS = ("broker", "socketio", "relay")
TRACE = bool(os.environ.get("BENCH_TRACE"))
CWD = "/srv/bench"
TENANT = "default"


@dataclass(frozen=True)
class Shape:
    sessions: int
    watchers: int
    rate: float  # offered updates/s (all sessions together) for the fixed-rate run
    rate_seconds: float
    max_updates: int  # updates sent as fast as possible in the max run

    @property
    def name(self) -> str:
        return f"S={self.sessions}/W={self.watchers}"


FULL: tuple[Shape, ...] = (
    Shape(1, 1000, 20, 10, 300),
    Shape(100, 10, 1000, 10, 20_000),
    Shape(1000, 2, 2500, 8, 40_000),
)
QUICK: tuple[Shape, ...] = (Shape(2, 10, 20, 2, 60),)

Send = Callable[[list[str]], Awaitable[Any]]
"""Sends one update to each room of a list (a room may repeat), in one round trip."""


def update_body(stamp: float) -> dict[str, Any]:
    text = f"ts={stamp:.6f}"
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


async def broker_feeder(
    redis_url: str, tree: Path | None = None
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """``tree``: a baseline's checkout, whose append scripts the appends run (an agent host
    of that revision appends with them; the Python side is this tree's)."""
    from broker.store.client import commands, connect
    from broker.store.log import SessionLog, batch_script

    store = connect(redis_url)
    log = SessionLog(store)
    if tree is not None:
        lua = tree / "broker" / "store" / "lua"
        append = (lua / "append.lua").read_text()
        log.appender._append = commands(store).register_script(append)
        batch = (lua / "append_batch.lua").read_text()
        log.appender._append_batch = commands(store).register_script(batch_script(append, batch))
        floors = "floor" in append  # revisions before floors take no ARGV[15]
        if "Arguments layout 2" not in batch:
            log.appender._batch_call = _layout1_batch_call(log, floors)  # type: ignore[method-assign,assignment]
        elif not floors:
            log.appender._batch_call = _floorless_batch_call(log)  # type: ignore[method-assign,assignment]

    async def send(rooms: list[str]) -> None:
        now = time.time()
        body = {"type": "update", "update": update_body(now)}
        for failed in await log.append_many([(TENANT, room, body, "") for room in rooms]):
            if isinstance(failed, Exception):
                raise failed

    return send, store.aclose


def _floorless_batch_call(
    log: SessionLog,
) -> Callable[
    [Sequence[tuple[str, str, JsonObject, str]], Sequence[str]], tuple[list[str], list[Any]]
]:
    """The batch script's layout 2 arguments as revisions before floors take them: this
    tree's, each event's floor (the 7th of its arguments) left out."""
    mine = log.appender._batch_call

    def batch_call(
        items: Sequence[tuple[str, str, JsonObject, str]], ids: Sequence[str]
    ) -> tuple[list[str], list[Any]]:
        keys, args = mine(items, ids)
        out, at = args[:5], 5
        for _ in items:
            ops = int(args[at + 7])
            out += args[at : at + 6] + args[at + 7 : at + 8 + 3 * ops]
            at += 8 + 3 * ops
        return keys, out

    return batch_call


def _layout1_batch_call(
    log: SessionLog, floors: bool = True
) -> Callable[
    [Sequence[tuple[str, str, JsonObject, str]], Sequence[str]], tuple[list[str], list[Any]]
]:
    """The batch script's arguments as revisions before its layout 2 take them: every
    event's own append.lua arguments, their counts first (``LogAppender._call`` still makes
    one event's; ``floors``: the revision's append.lua takes a floor)."""

    def batch_call(
        items: Sequence[tuple[str, str, JsonObject, str]], ids: Sequence[str]
    ) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        counts: list[int] = []
        args: list[Any] = []
        for (tenant, session_id, body, fence), call in zip(items, ids, strict=True):
            one_keys, one_args = log.appender._call(
                tenant, session_id, body, mode="append", fence=fence, call=call
            )
            if not floors:
                del one_args[14]  # ARGV[15], the floor
            keys += one_keys
            counts.append(len(one_args))
            args += one_args
        return keys, [len(items), *counts, *args]

    return batch_call


async def relay_feeder(redis_url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import redis.asyncio as redis

    store = redis.Redis.from_url(redis_url)
    seq = 0

    async def send(rooms: list[str]) -> None:
        nonlocal seq
        now = time.time()
        async with store.pipeline(transaction=False) as pipe:
            for room in rooms:
                seq += 1
                params = {
                    "sessionId": room,
                    "update": update_body(now),
                    "_meta": {"acpBroker/position": {"seq": seq, "epoch": "0123456789abcdef"}},
                }
                frame = {"jsonrpc": "2.0", "method": "session/update", "params": params}
                pipe.publish("relay:" + room, json.dumps(frame, separators=(",", ":")))
            await pipe.execute()

    return send, store.aclose


async def socketio_feeder(redis_url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import socketio

    manager = socketio.AsyncRedisManager(redis_url, write_only=True)
    seq = 0

    async def one(room: str, now: float) -> None:
        nonlocal seq
        seq += 1
        params = {
            "sessionId": room,
            "update": update_body(now),
            "_meta": {"acpBroker/position": {"seq": seq, "epoch": "0123456789abcdef"}},
        }
        await manager.emit("update", params, room=room, namespace="/")

    async def send(rooms: list[str]) -> None:
        # One at a time: AsyncRedisManager publishes on one connection and gives messages
        # up ("Cannot publish to redis... giving up") when many are emitted at once.
        now = time.time()
        for room in rooms:
            await one(room, now)

    async def close() -> None:
        return None

    return send, close


FEEDERS = {"broker": broker_feeder, "relay": relay_feeder, "socketio": socketio_feeder}


async def feeder_of(system: str, redis_url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """The feeder of ``system``; a ``broker@REV`` one appends with REV's append scripts."""
    kind, _, rev = system.partition("@")
    if rev:
        return await broker_feeder(redis_url, common.baseline_tree(rev))
    return await FEEDERS[kind](redis_url)


async def feed(
    send: Send, rooms: list[str], count: int, rate: float | None, seconds: float, first: int = 0
) -> int:
    """Send ``count`` updates round robin over ``rooms`` (from the ``first``-th on): at
    ``rate``/s, or as fast as it goes (batches of 64, one round trip each). Bounded by
    ``seconds``. Returns how many were sent."""
    start = time.monotonic()
    deadline = start + seconds
    sent = 0
    while sent < count and time.monotonic() < deadline:
        if rate:
            due = min(count, int((time.monotonic() - start) * rate) + 1)
        else:
            due = min(count, sent + 64)
        batch = [rooms[(first + i) % len(rooms)] for i in range(sent, due)]
        sent = due
        if batch:
            await send(batch)
        if rate:
            await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
    return sent


@contextlib.asynccontextmanager
async def servers(
    system: str, redis_url: str, tag: str, sessions: int
) -> AsyncIterator[tuple[list[str], list[int], list[str]]]:
    """Start the 2 server nodes of ``system``; yields (urls, pids, rooms)."""
    async with contextlib.AsyncExitStack() as stack:
        if system == "broker":
            await stack.enter_async_context(common.agent_host(redis_url, tag))
            nodes = await stack.enter_async_context(common.fronts(redis_url, 2, tag))
            rooms = await new_sessions(nodes[0].url, sessions, CWD)
            yield [n.url for n in nodes], [n.pid for n in nodes], rooms
            return
        if system.startswith("broker@"):  # the broker's fronts as they were at a revision
            tree = common.baseline_tree(system.partition("@")[2])
            await stack.enter_async_context(common.agent_host(redis_url, tag))
            pairs = await stack.enter_async_context(common.fronts_at(tree, redis_url, 2, tag))
            rooms = await new_sessions(pairs[0][0], sessions, CWD)
            yield [u for u, _ in pairs], [p for _, p in pairs], rooms
            return
        module = {"relay": "bench.peers.relay", "socketio": "bench.peers.socketio_server"}[system]
        urls, pids = [], []
        for i in range(2):
            node = await stack.enter_async_context(
                common.child(module, redis_url, name=f"{tag}-{system}{i}")
            )
            port = await node.expect("ready")
            path = "/socket.io/?EIO=4&transport=websocket" if system == "socketio" else "/"
            urls.append(f"ws://127.0.0.1:{port}{path}")
            pids.append(node.pid)
        yield urls, pids, [f"room{i}" for i in range(sessions)]


async def swarm_counts(swarms: list[common.Child]) -> int:
    return (await swarm_progress(swarms))[0]


async def swarm_progress(swarms: list[common.Child]) -> tuple[int, float]:
    """Messages the swarms counted since their last report, and the time of the last
    arrival among them (unix time; 0 if none yet)."""
    total, last = 0, 0.0
    for swarm in swarms:
        await swarm.send("count")
        count, stamp = (await swarm.expect("count")).split()
        total += int(count)
        last = max(last, float(stamp))
    return total, last


async def swarm_reports(swarms: list[common.Child]) -> list[dict[str, Any]]:
    out = []
    for swarm in swarms:
        await swarm.send("report")
        out.append(json.loads(await swarm.expect("report", timeout=120)))
    return out


async def settle(swarms: list[common.Child], expected: int) -> int:
    """Wait until the swarms have counted ``expected`` messages (since their last report),
    or nothing more arrived for 3 s (at most 60 s); returns how many they counted."""
    got, still, deadline = 0, time.monotonic(), time.monotonic() + 60
    while time.monotonic() < deadline:
        now_got = await swarm_counts(swarms)
        if now_got >= expected:
            return now_got
        if now_got != got:
            got, still = now_got, time.monotonic()
        elif time.monotonic() - still > 3.0:
            break
        await asyncio.sleep(0.05)
    return got


@dataclass
class Tally:
    """What one system's turns of an interleaved run added up to."""

    sent: int = 0
    feed_seconds: float = 0.0
    cpu: float = 0.0
    machine: common.MachineCpu = field(default_factory=lambda: common.MachineCpu(0.0, 0.0))
    seconds: float = 0.0
    t0: float = 0.0
    active: float = 0.0  # summed slice durations: each slice's first send to last delivery
    slices: list[list[float]] = field(default_factory=list)  # [sent, delivered, seconds]
    delivered: int = 0  # counted by the end of the last slice


async def measure(
    systems: list[Running], count: int, rate: float | None, slices: int = 1
) -> dict[str, dict[str, Any]]:
    """Send ``count`` updates to each system (at ``rate``/s, or as fast as it goes) and
    measure what its watchers got; keyed by system.

    ``slices`` > 1 interleaves the systems: each system's updates go in ``slices`` turns,
    the systems taking turns (A, B, A, B, …; each turn waits until its deliveries have
    arrived), so that a stretch of noise from the rest of a shared machine lands on all of
    them alike instead of on whichever one it happened to overlap. CPU is counted over a
    system's own turns only, and delivered/s over the summed durations of its turns (each
    from its first send to its last delivery)."""
    for r in systems:
        await swarm_reports(r.swarms)  # start counting afresh
    tallies = {r.system: Tally() for r in systems}
    per = count // slices
    for k in range(slices):
        n = per if k < slices - 1 else count - per * (slices - 1)
        for r in systems:
            tally = tallies[r.system]
            cpu0, machine0, t0 = common.cpu_of(r.pids), common.machine_cpu(), time.time()
            tally.t0 = tally.t0 or t0
            with common.collector_paused():
                sent = await feed(r.send, r.rooms, n, rate, seconds=120, first=per * k)
                tally.sent += sent
                tally.feed_seconds += time.time() - t0
                await settle(r.swarms, tally.sent * r.joined // len(r.rooms))
                delivered, last = await swarm_progress(r.swarms)
            got, tally.delivered = delivered - tally.delivered, delivered
            took = max(0.0, last - t0) if got else 0.0
            tally.active += took
            tally.slices.append([sent, got, took])
            tally.cpu += common.cpu_of(r.pids) - cpu0
            tally.machine = tally.machine + (common.machine_cpu() - machine0)
            tally.seconds += time.time() - t0
    return {r.system: await _summary(r, tallies[r.system], rate) for r in systems}


async def _summary(r: Running, tally: Tally, rate: float | None) -> dict[str, Any]:
    """One system's figures from its swarms' reports and its tally."""
    reports = await swarm_reports(r.swarms)
    delivered = sum(rep["count"] for rep in reports)
    expected = tally.sent * r.joined // len(r.rooms)
    samples: list[float] = []
    for rep in reports:
        samples.extend(rep["samples"])
    lat = common.latency_summary(samples)
    seconds = max(tally.seconds, 1e-9)
    return {
        "offered_rate": rate,
        "sent": tally.sent,
        "feed_seconds": tally.feed_seconds,
        "expected": expected,
        "delivered": delivered,
        "lost": max(0, expected - delivered),
        "delivered_per_s": delivered / max(tally.active, 1e-9),
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "p999_ms": lat["p999"],
        "cpu_s": tally.cpu,
        "cpu_us_per_delivery": tally.cpu / delivered * 1e6 if delivered else float("nan"),
        "t0": tally.t0,
        "others_cores": tally.machine.others / seconds,
        "machine_cores": tally.machine.busy / seconds,
        "slices": tally.slices,
        **({"trace": [rep["updates"] for rep in reports]} if TRACE else {}),
    }


@dataclass
class Running:
    """One system, up and joined, ready to be measured."""

    system: str
    send: Send
    swarms: list[common.Child]
    pids: list[int]
    rooms: list[str]
    joined: int


@contextlib.asynccontextmanager
async def running(system: str, shape: Shape, tag: str) -> AsyncIterator[Running]:
    """A private Redis, the system's 2 nodes and 2 swarm processes, all joined."""
    with common.private_redis() as redis_url:
        async with servers(system, redis_url, tag, shape.sessions) as (urls, pids, rooms):
            targets: list[list[dict[str, Any]]] = [[], []]
            k = 0
            for room in rooms:
                for node in range(2):
                    n = shape.watchers // 2 + (shape.watchers % 2 if node == 0 else 0)
                    if n:
                        targets[k % 2].append({"url": urls[node], "room": room, "n": n})
                        k += 1
            async with contextlib.AsyncExitStack() as stack:
                swarms = []
                for i, part in enumerate(targets):
                    config = {
                        "system": system.partition("@")[0],
                        "targets": part,
                        "cwd": CWD,
                        "concurrency": 64,
                        "trace": TRACE,
                    }
                    swarms.append(
                        await stack.enter_async_context(
                            common.child("bench.swarm", json.dumps(config), name=f"{tag}-swarm{i}")
                        )
                    )
                joined = 0
                for swarm in swarms:
                    ready = json.loads(await swarm.expect("ready", timeout=300))
                    joined += ready["joined"]
                    if ready["failed"]:
                        print(f"  {system}: {ready['failed']} joins failed: {ready}", flush=True)
                send, close = await feeder_of(system, redis_url)
                try:
                    await feed(send, rooms, 2 * len(rooms), None, 30)  # warm-up
                    yield Running(system, send, swarms, pids, rooms, joined)
                finally:
                    await close()
                    for swarm in swarms:
                        await swarm.send("quit")


@contextlib.asynccontextmanager
async def profiled(on: bool, r: Running, name: str, *, gil: bool = False) -> AsyncIterator[None]:
    """py-spy (1,000 Hz) of the system's first node while the block runs, if ``on``:
    ``bench/results/profile-NAME.txt``; ``gil``: CPU samples only (at a fixed rate the
    node mostly waits in ``epoll``)."""
    if not on:
        yield
        return
    from bench.profile import recording

    async with recording(r.pids[0], common.RESULTS / f"profile-{name}.txt", gil=gil):
        yield


async def run_shape(
    shape: Shape, systems: tuple[str, ...], rounds: int, profile: bool, slices: int = 1
) -> list[dict[str, Any]]:
    """All systems up side by side (idle when not measured), measured in alternating rounds:
    every round runs each system at the fixed rate, then each at max, in a rotating order,
    so that the machine's noise over time hits all of them alike; ``slices`` > 1: the
    fixed-rate runs of a round interleaved in that many turns each, then the max runs
    likewise (see :func:`measure`)."""
    tag = f"fanout-{shape.sessions}x{shape.watchers}"
    got: dict[str, dict[str, list[dict[str, Any]]]] = {s: {"rate": [], "max": []} for s in systems}
    async with contextlib.AsyncExitStack() as stack:
        up = [
            await stack.enter_async_context(running(system, shape, f"{tag}-{system}"))
            for system in systems
        ]
        joined = {r.system: r.joined for r in up}
        await asyncio.sleep(1.0)
        for k in range(rounds):
            order = up[k % len(up) :] + up[: k % len(up)]
            print(f"fanout {shape.name} round {k + 1}/{rounds}", flush=True)
            count = int(shape.rate * shape.rate_seconds)
            for mode, n, rate in (("rate", count, shape.rate), ("max", shape.max_updates, None)):
                turns = max(1, min(slices, n))
                if turns > 1:
                    for system, cell in (await measure(order, n, rate, turns)).items():
                        got[system][mode].append(cell)
                    continue
                suffix = "-rate" if rate else ""
                for r in order:
                    name = f"{tag}-{r.system}{suffix}"
                    async with profiled(profile and k == 0, r, name, gil=bool(rate)):
                        got[r.system][mode].append((await measure([r], n, rate))[r.system])
    results = []
    for system in systems:
        runs = [
            {"rate": rate, "max": mx}
            for rate, mx in zip(got[system]["rate"], got[system]["max"], strict=True)
        ]
        cell = median_result(runs)
        cell.update(system=system, shape=shape.name, joined=joined[system])
        results.append(cell)
    return results


def summarize(results: list[dict[str, Any]], shapes: tuple[Shape, ...]) -> tuple[list[str], Any]:
    rows, ratio_rows = [], []
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for result in results:
        cells[(result["system"], result["shape"])] = result
    for shape in shapes:
        names = list(dict.fromkeys(r["system"] for r in results if r["shape"] == shape.name))
        for system in names:
            r = cells.get((system, shape.name))
            if r is None:
                continue
            rt, mx = r["rate"], r["max"]
            rows.append(
                [
                    shape.name,
                    system,
                    f"{rt['offered_rate']:g}/s",
                    rt["p50_ms"],
                    rt["p99_ms"],
                    rt["p999_ms"],
                    rt["cpu_us_per_delivery"],
                    mx["delivered_per_s"],
                    mx["p99_ms"],
                    mx["cpu_us_per_delivery"],
                    rt["lost"] + mx["lost"],
                ]
            )
        b, s, c = (cells.get((x, shape.name)) for x in SYSTEMS)
        if b and c:
            cpu = "cpu_us_per_delivery"
            ratio_rows.append(
                [
                    shape.name,
                    common.ratio(b["rate"][cpu], c["rate"][cpu]),
                    common.ratio(b["max"][cpu], c["max"][cpu]),
                    common.ratio(b["max"][cpu], s["max"][cpu]) if s else float("nan"),
                    common.ratio(b["max"]["delivered_per_s"], c["max"]["delivered_per_s"]),
                    common.ratio(b["rate"]["p99_ms"], c["rate"]["p99_ms"]),
                ]
            )
    main = common.table(
        "Fan-out (2 front nodes; latency = agent emit to client receive)",
        [
            "shape",
            "system",
            "offered",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "CPU µs/deliv",
            "max deliv/s",
            "max p99 ms",
            "max CPU µs/deliv",
            "lost",
        ],
        rows,
    )
    ratios = common.table(
        "Fan-out ratios (broker ÷ ceiling, broker ÷ python-socketio)",
        [
            "shape",
            "CPU/deliv ÷ ceiling, at rate (≤1.5)",
            "CPU/deliv ÷ ceiling, at max (≤1.5)",
            "CPU/deliv ÷ socketio, at max (≤0.33)",
            "max deliv/s ÷ ceiling (≥0.9)",
            "p99 at rate ÷ ceiling (≤1.5)",
        ],
        ratio_rows,
    )
    return [main, ratios], ratio_rows


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-field median of several rounds of one cell."""
    out: dict[str, Any] = {}
    for mode in ("rate", "max"):
        out[mode] = {
            key: common.median([r[mode][key] for r in runs])
            if isinstance(runs[0][mode][key], int | float) and runs[0][mode][key] is not None
            else runs[0][mode][key]
            for key in runs[0][mode]
        }
    out["runs"] = runs
    return out


async def run(args: Any) -> None:
    common.raise_nofile()
    shapes = QUICK if args.quick else FULL
    if args.shape:
        shapes = tuple(s for s in shapes if s.name in args.shape)
    systems = tuple(args.systems or SYSTEMS) + tuple(f"broker@{rev}" for rev in args.baseline)
    rounds = args.rounds or (1 if args.quick else 3)
    results = []
    for shape in shapes:
        results.extend(
            await run_shape(shape, systems, rounds * args.runs, args.profile, args.slices)
        )
        tables, ratios = summarize(results, shapes)  # so far: a later failure keeps these
        print(tables[0], flush=True)
        common.write_json("fanout", {"quick": args.quick, "results": results}, args.out)
    tables, ratios = summarize(results, shapes)
    data = {"quick": args.quick, "results": results, "ratios": ratios}
    common.report("fanout", tables, data, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("fanout", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--systems", nargs="*", choices=SYSTEMS)
    common.add_baseline(p)
    p.add_argument("--shape", nargs="*", help="e.g. S=1/W=1000")
    p.add_argument("--rounds", type=int, default=0, help="alternating rounds (default 3)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the first node during the first round (rate and max runs)",
    )
    p.add_argument(
        "--slices",
        type=int,
        default=10,
        help="interleave the systems' runs of a round (fixed-rate, then max) in this many "
        "turns each (default 10; 1: one system's whole run after the other's, as --profile "
        "does)",
    )
    args = p.parse_args(argv)
    if args.profile:
        args.slices = 1  # a profile records one system's whole run
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
