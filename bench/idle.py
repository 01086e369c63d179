"""What an idle broker costs its Redis: commands a second, by command, with nobody using it.

A front (``serve --no-workers``), an agent host and a projector, each its own process as
deployed, on a private Redis (``--cluster``: a private 3-master Redis Cluster with a replica
each, ``tests/support/redis_cluster.py``). Once every role is ready (and ``--sessions``
sessions were made and left, their agents still running), the run waits ``--settle``
seconds, then reads ``INFO commandstats`` of every master before and after ``--seconds``
of idleness: the difference, by command, is what the broker sends while nobody uses it
(``info`` excludes the readings' own). ``--together``: one ``serve`` process with every
role instead.

Then what idleness costs a list's freshness: ``--probes`` times, a session is logged by
this process's own store client (as another agent host would) after the projector has
been idle for :data:`IDLE_BEFORE_PROBE` seconds (past ``feed_bell.AWAKE``: asleep, on a
cluster, until a bell), and the time until its index row exists is measured.

    python -m bench idle --cluster
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench import common
from broker.store.client import connect
from broker.store.feed_bell import AWAKE
from broker.store.index import SessionIndex
from broker.store.log import SessionLog, new_session_id
from tests.support.commandstats import calls_between, command_calls
from tests.support.roles import role_process

IDLE_BEFORE_PROBE = AWAKE + 1.0
"""Seconds left idle before each freshness probe."""
CREATED = {"type": "created", "cwd": "/idle", "agent": "demo", "kind": "shell"}


async def _freshness(url: str, probes: int) -> list[float]:
    """Milliseconds from a session's logging (by another client) to its index row, each
    after :data:`IDLE_BEFORE_PROBE` seconds of idleness."""
    store = connect(url)
    log, index = SessionLog(store), SessionIndex(store)
    loop = asyncio.get_running_loop()
    took = []
    try:
        for _ in range(probes):
            await asyncio.sleep(IDLE_BEFORE_PROBE)  # idleness is what is measured
            session_id = new_session_id()
            await log.create("default", session_id, CREATED)
            began = loop.time()
            for _ in range(4000):  # up to 20 s
                if await index.row("default", session_id) is not None:
                    break
                await asyncio.sleep(0.005)
            took.append((loop.time() - began) * 1000)
    finally:
        await store.aclose()
    return took


@contextlib.asynccontextmanager
async def _broker(url: str, logs: Path, together: bool) -> AsyncIterator[int]:
    """The broker's roles on ``url``; yields the front's port."""
    if together:
        async with common.broker_process(url, log_path=logs / "serve.log") as node:
            yield node.port
        return
    async with (
        role_process("agent-host", url, logs / "host.log"),
        role_process("projector", url, logs / "projector.log"),
        common.broker_process(url, log_path=logs / "front.log", extra_args=["--no-workers"]) as f,
    ):
        yield f.port


async def _make_sessions(port: int, count: int) -> None:
    from tests.support.client import RawClient

    if count:
        client = await RawClient.initialized(f"ws://127.0.0.1:{port}/acp")
        for i in range(count):
            await client.new_session(f"/idle/{i}")
        await client.close()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with (
        common.private_store(args.cluster) as (url, masters),
        tempfile.TemporaryDirectory() as logs,
    ):
        async with _broker(url, Path(logs), args.together) as port:
            await _make_sessions(port, args.sessions)
            await asyncio.sleep(args.settle)  # start-up's own commands, done
            before = await asyncio.to_thread(command_calls, masters)
            await asyncio.sleep(args.seconds)  # the measurement: idleness itself
            after = await asyncio.to_thread(command_calls, masters)
            listed_ms = await _freshness(url, args.probes)
    made = calls_between(before, after, len(masters))
    rates = {name: calls / args.seconds for name, calls in made.most_common()}
    return {
        "masters": len(masters),
        "total": sum(rates.values()),
        "per_command": rates,
        "listed_ms": listed_ms,
    }


async def run(args: argparse.Namespace) -> None:
    got = await measure(args)
    rows = [[name, rate] for name, rate in got["per_command"].items()]
    rows.append(["total", got["total"]])
    where = f"a {got['masters']}-master Redis Cluster" if args.cluster else "one Redis server"
    roles = "one serve process" if args.together else "front, agent host, projector"
    text = common.table(
        f"An idle broker ({roles}; {args.sessions} sessions) on {where}: "
        f"commands/s over {args.seconds:g} s",
        ["command", "calls/s"],
        rows,
    )
    tables = [text]
    if got["listed_ms"]:
        took = got["listed_ms"]
        tables.append(
            common.table(
                f"A session logged after {IDLE_BEFORE_PROBE:g} s of idleness: ms until listed",
                ["probes", "median", "max"],
                [[len(took), common.median(took), max(took)]],
            )
        )
    data = {**vars(args), **got}
    data.pop("out", None)
    common.report("idle", tables, data, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("idle", (__doc__ or "").splitlines()[0])
    p.add_argument("--cluster", action="store_true", help="a 3-master Redis Cluster")
    p.add_argument("--together", action="store_true", help="one serve process, every role")
    p.add_argument("--sessions", type=int, default=0, help="sessions made before idling")
    p.add_argument("--seconds", type=float, default=10.0, help="the idle window measured")
    p.add_argument("--settle", type=float, default=3.0, help="seconds after start, not counted")
    p.add_argument("--probes", type=int, default=5, help="freshness probes after the window")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.settle = min(args.seconds, 3.0), min(args.settle, 1.0)
        args.probes = min(args.probes, 1)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
