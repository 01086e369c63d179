"""Batch appends alone: what ``SessionLog.append_many`` costs the appending process and Redis
per event, for this tree's batch script and a ``--baseline REV``'s, side by side.

A private redis-server holds ``--sessions`` sessions; each round appends ``--batches``
batches of 64 updates (the fan-out feeder's, ``bench.fanout.broker_feeder``) to sessions
picked at random, one batch after another, through each tree's scripts in turn (alternating
round by round so the machine's noise hits all alike). Per event: this process's CPU
(``time.process_time``, the packing and the reply's parse included) and Redis's
``evalsha`` usec_per_call divided by 64 (``INFO commandstats``, reset before each round:
the script's run), and redis-server's CPU (its reading and parsing of the arguments too).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from bench import common
from bench.fanout import TENANT, broker_feeder

BATCH = 64


async def _round(url: str, tree: Any, rooms: list[str], batches: int) -> tuple[float, float, float]:
    """One round, per event: this process's CPU µs, Redis's evalsha µs (the script's run)
    and redis-server's CPU µs (its reading and parsing of the arguments too)."""
    import redis.asyncio as redis

    send, close = await broker_feeder(url, tree)
    admin = redis.Redis.from_url(url)
    try:
        picks = [random.choices(rooms, k=BATCH) for _ in range(batches)]
        await send(picks[0])  # the script loaded, the connections open
        await admin.config_resetstat()
        pid = common.redis_pid(url) or 0
        redis_started = common.cpu_seconds(pid)
        started = time.process_time()
        for batch in picks:
            await send(batch)
        cpu = time.process_time() - started
        redis_cpu = common.cpu_seconds(pid) - redis_started
        stats = (await admin.info("commandstats"))["cmdstat_evalsha"]
        events = batches * BATCH
        usec = float(stats["usec"]) / (int(stats["calls"]) * BATCH)
        return cpu / events * 1e6, usec, redis_cpu / events * 1e6
    finally:
        await close()
        await admin.aclose()


async def run(args: Any) -> dict[str, dict[str, list[float]]]:
    from broker.store.client import connect
    from broker.store.log import SessionLog

    systems: dict[str, Any] = {"broker": None}
    for rev in args.baseline:
        systems[f"broker@{rev}"] = common.baseline_tree(rev)
    found: dict[str, dict[str, list[float]]] = {
        name: {"cpu_us": [], "evalsha_us": [], "redis_cpu_us": []} for name in systems
    }
    with common.private_redis() as url:
        store = connect(url)
        log = SessionLog(store)
        rooms = [f"room-{i}" for i in range(args.sessions)]
        created = {"type": "created", "cwd": "/srv/bench", "agent": "demo", "kind": "shell"}
        for room in rooms:
            await log.create(TENANT, room, created)
        await store.aclose()
        for _ in range(args.rounds):
            for name, tree in systems.items():
                cpu, usec, redis_cpu = await _round(url, tree, rooms, args.batches)
                found[name]["cpu_us"].append(cpu)
                found[name]["evalsha_us"].append(usec)
                found[name]["redis_cpu_us"].append(redis_cpu)
    return found


def main(argv: list[str] | None = None) -> None:
    p = common.parser("batch_args", __doc__ or "")
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--batches", type=int, default=500, help="batches of 64 per round")
    p.add_argument("--rounds", type=int, default=5)
    common.add_baseline(p)
    args = p.parse_args(argv)
    found = asyncio.run(run(args))
    rows = [
        [name, *(common.median(v[k]) for k in ("cpu_us", "evalsha_us", "redis_cpu_us"))]
        for name, v in found.items()
    ]
    print(
        common.table(
            "batch appends, per event (medians of rounds)",
            ["system", "appender CPU µs", "evalsha µs", "redis-server CPU µs"],
            rows,
        )
    )
    common.write_json("batch_args", {"results": found}, args.out)


if __name__ == "__main__":
    main()
