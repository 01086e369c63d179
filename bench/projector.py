"""Projector: CPU per event, index lag, and whether one projector keeps up.

A projector runs as its own process (``worker projector``) against a private
redis-server; this process appends events (``agent_message_chunk`` updates, each
of which moves the session in the listings) through the append script at a set
rate over a set number of sessions, in ticks of 10 ms, one ``append_many`` a
tick. Measured over the load's steady part:

* **CPU per event**: the projector process's user + system time ÷ events appended;
* **index lag**: from an append's return until the index holds that event's seq
  (the session's version in the index), sampled on a few events a tick and polled
  every 2 ms;
* **drain**: once the load stops, how long until every session's newest event is
  in the index (a projector that fell behind shows it here).

``--cluster``: on a private 3-master Redis Cluster (``tests/support/redis_cluster.py``)
instead, where the projector polls the feeds between their bells (``feed_bell.py``).

Cells: ``soak`` is the issue's 5-minute soak in miniature (20 sessions, 700 events/s
in all); ``max`` is 1,000 sessions at 10,000 events/s. ``--baseline REV`` runs the
projector as of a git revision too, alternating with this tree's, run by run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common
from bench.profile import recording

TENANT = "default"
TICK = 0.01
SAMPLES_PER_TICK = 2


@dataclass(frozen=True)
class Cell:
    name: str
    sessions: int
    rate: int  # events/s, all sessions together
    seconds: float


CELLS = (Cell("soak", 20, 700, 20.0), Cell("max", 1000, 10_000, 10.0))
QUICK = (Cell("soak", 10, 300, 3.0), Cell("max", 200, 2_000, 3.0))


def body(i: int) -> dict[str, Any]:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": f"c{i}"}}
    return {"type": "update", "update": update}


@contextlib.asynccontextmanager
async def projector_at(tree: Path | None, url: str, tag: str) -> AsyncIterator[int]:
    """A projector process running this tree's code (None) or ``tree``'s; yields its pid."""
    code = "from broker.cli import main; import sys; sys.exit(main())"
    cwd = common.ROOT
    env = {**common.broker_env(), **common.BENCH_ENV}
    if tree is not None:
        code = f"import sys; sys.path.insert(0, {str(tree)!r}); " + code
        cwd, env["PYTHONPATH"] = tree, str(tree)
    common.LOGS.mkdir(parents=True, exist_ok=True)
    with open(common.LOGS / f"projector-{tag}.log", "ab") as log_file:  # noqa: ASYNC230
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            "worker",
            "projector",
            "--redis-url",
            url,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            env=env,
            cwd=str(cwd),
            start_new_session=True,
        )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if b"ready" not in line:
            raise RuntimeError(f"the projector did not start; see projector-{tag}.log")
        yield proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


class LagProbe:
    """Samples appended events and times until the index holds them."""

    def __init__(self, store: Any) -> None:
        from broker.store.keys import TenantKeys

        self.store = store
        self.versions = TenantKeys(TENANT).versions
        self.waiting: list[tuple[str, int, float]] = []
        self.lags_ms: list[float] = []
        self.recording = False

    def sample(self, session_id: str, seq: int) -> None:
        self.waiting.append((session_id, seq, time.perf_counter()))

    async def indexed(self, session_ids: list[str]) -> list[int]:
        from broker.store.index import Version

        raws = await self.store.hmget(self.versions, session_ids)
        return [(v.seq if (v := Version.decode(raw)) else 0) for raw in raws]

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.002)
            if not self.waiting:
                continue
            waiting, self.waiting = self.waiting, []
            seqs = await self.indexed([sid for sid, _, _ in waiting])
            now = time.perf_counter()
            for (sid, seq, t0), held in zip(waiting, seqs, strict=True):
                if held >= seq:
                    if self.recording:
                        self.lags_ms.append((now - t0) * 1000)
                else:
                    self.waiting.append((sid, seq, t0))


async def run_cell(
    cell: Cell, tree: Path | None, tag: str, profile: bool = False, cluster: bool = False
) -> dict[str, float]:
    from broker.store.client import connect
    from broker.store.events import EventType
    from broker.store.log import SessionLog, new_session_id
    from tests.support.commandstats import calls_between, command_calls

    with common.private_store(cluster) as (url, masters):
        store = connect(url)
        log = SessionLog(store)
        sessions = [new_session_id() for _ in range(cell.sessions)]
        created = {"type": EventType.CREATED, "cwd": "/bench", "agent": "demo", "kind": "combined"}
        for first in range(0, len(sessions), 100):
            await asyncio.gather(
                *(log.create(TENANT, s, created) for s in sessions[first : first + 100])
            )
        async with contextlib.AsyncExitStack() as stack:
            pid = await stack.enter_async_context(projector_at(tree, url, tag))
            if profile:
                out = common.RESULTS / f"profile-projector-{tag}.txt"
                await stack.enter_async_context(recording(pid, out, gil=True))
            probe = LagProbe(store)
            poller = asyncio.create_task(probe.run())
            per_tick = max(1, round(cell.rate * TICK))
            warmup = min(2.0, cell.seconds / 4)
            appended = i = 0
            cpu0 = t0 = 0.0
            loop = asyncio.get_running_loop()
            start = next_tick = loop.time()
            last: dict[str, int] = {}
            while loop.time() - start < cell.seconds + warmup:
                if not probe.recording and loop.time() - start >= warmup:
                    probe.recording, appended = True, 0
                    cpu0, t0 = common.cpu_seconds(pid), time.perf_counter()
                    calls0 = command_calls(masters)
                items = []
                for _ in range(per_tick):
                    items.append((TENANT, sessions[i % len(sessions)], body(i), ""))
                    i += 1
                positions = await log.append_many(items)
                for k, (item, position) in enumerate(zip(items, positions, strict=True)):
                    if isinstance(position, Exception):
                        raise position
                    last[item[1]] = position.seq
                    if k < SAMPLES_PER_TICK:
                        probe.sample(item[1], position.seq)
                appended += len(items)
                next_tick += TICK
                await asyncio.sleep(max(0.0, next_tick - loop.time()))
            elapsed = time.perf_counter() - t0
            cpu = common.cpu_seconds(pid) - cpu0
            calls = calls_between(calls0, command_calls(masters), len(masters))
            stop = time.perf_counter()
            drained = float("nan")
            deadline = common.Deadline(60)
            while deadline:
                ids = list(last)
                if all(h >= last[s] for s, h in zip(ids, await probe.indexed(ids), strict=True)):
                    drained = (time.perf_counter() - stop) * 1000
                    break
                await asyncio.sleep(0.005)
            probe.recording = False
            poller.cancel()
        await store.aclose()
    lag = common.latency_summary(probe.lags_ms)
    return {
        "events/s": appended / elapsed,
        # Below 1 the generator (this process) fell short of the rate asked: on a busy
        # machine it shares the cores with Redis and the projector.
        "of asked": appended / elapsed / cell.rate,
        "cpu us/event": cpu / appended * 1e6,
        # Every command Redis ran meanwhile (the appends' scripts and bells included).
        "redis cmd/event": sum(calls.values()) / appended,
        "lag p50 ms": lag["p50"],
        "lag p99 ms": lag["p99"],
        "drain ms": drained,
    }


def main(argv: list[str]) -> None:
    p = common.parser("projector", __doc__ or "")
    common.add_baseline(p)
    p.add_argument("--cells", default="soak,max", help="which cells (soak, max)")
    p.add_argument("--profile", action="store_true", help="py-spy the projectors (bench/results)")
    p.add_argument("--cluster", action="store_true", help="on a 3-master Redis Cluster")
    args: argparse.Namespace = p.parse_args(argv)
    cells = [c for c in (QUICK if args.quick else CELLS) if c.name in args.cells.split(",")]
    systems: list[tuple[str, Path | None]] = [("this tree", None)]
    systems += [(f"at {rev}", common.baseline_tree(rev)) for rev in args.baseline]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for run in range(args.runs):
        for cell in cells:
            for name, tree in systems:
                tag = f"{cell.name}-{run}-{name.replace(' ', '_')}"
                reading = asyncio.run(run_cell(cell, tree, tag, args.profile, args.cluster))
                results.setdefault((cell.name, name), []).append(reading)
    keys = ["events/s", "of asked", "cpu us/event", "redis cmd/event"]
    keys += ["lag p50 ms", "lag p99 ms", "drain ms"]
    rows = []
    for (cell_name, system), readings in results.items():
        rows.append([cell_name, system, *(common.median([r[k] for r in readings]) for k in keys)])
    where = "; a 3-master Redis Cluster" if args.cluster else ""
    title = f"Projector (medians of {args.runs} run(s); ticks of {TICK * 1000:.0f} ms{where})"
    table = common.table(title, ["cell", "projector", *keys], rows)
    data = {
        "quick": args.quick,
        "cluster": args.cluster,
        "cells": [
            {"cell": r[0], "system": r[1], **dict(zip(keys, r[2:], strict=True))} for r in rows
        ],
    }
    common.report("projector", [table], data, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
