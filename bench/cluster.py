"""Logging agent updates on a Redis Cluster: batches of events, one call per partition.

On a cluster one script call may not span slots, and every key of a session carries its
partition's hash tag, so ``SessionLog.append_many`` makes one ``append_batch.lua`` call per
partition a batch touches, the calls side by side. Beside it, in the same run, on a private
3-master cluster (``tests/support/redis_cluster.py``):

* **one call per event**: ``SessionLog.append`` for each event in turn (what a batch cost
  on a cluster before it was grouped by partition);
* **raw XADD** (the ceiling): the batch's events as bare ``XADD`` commands to streams
  beside the same sessions' logs, through one cluster pipeline (no snapshot, feed, fan-out
  or exactly-once).

Batches of 64 events spread over 1, 8 and 64 sessions (more sessions: more partitions,
more calls per batch). Rounds alternate the three ways; each figure is the median.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench import common
from broker.store.client import connect
from broker.store.keys import SessionKeys
from broker.store.log import SessionLog

BATCH = 64
SPREADS = (1, 8, 64)
CREATED = {"type": "created", "cwd": "/bench", "agent": "demo", "kind": "shell"}


def _chunk(text: str) -> dict[str, Any]:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    return {"type": "update", "update": update}


async def _ways(
    store: Any, log: SessionLog, spread: int
) -> dict[str, Callable[[], Awaitable[Any]]]:
    sessions = [f"bench-{spread}-{k}" for k in range(spread)]
    for session_id in sessions:
        await log.create("t", session_id, CREATED)
    items = [("t", sessions[i % spread], _chunk("x" * 40), "") for i in range(BATCH)]

    async def per_event() -> None:
        for tenant, session_id, body, fence in items:
            await log.append(tenant, session_id, body, fence=fence)

    async def per_partition() -> None:
        await log.append_many(items)

    async def raw_xadd() -> None:
        pipe = store.pipeline(transaction=False)
        for tenant, session_id, _, _ in items:
            pipe.xadd(SessionKeys(tenant, session_id).log + ":raw", {"b": "x" * 40})
        await pipe.execute()

    return {
        "append_many, a call per partition": per_partition,
        "append, a call per event (before)": per_event,
        "raw XADD, one pipeline (ceiling)": raw_xadd,
    }


async def run(args: Any) -> None:
    from tests.support.redis_cluster import redis_cluster

    rounds, batches = (2, 3) if args.quick else (5, 20)
    rows = []
    with redis_cluster() as info:
        info.wait_ok()
        store = connect(info.url)
        log = SessionLog(store)
        for spread in SPREADS:
            ways = await _ways(store, log, spread)
            rates: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(rounds):
                for name, way in ways.items():
                    began = time.perf_counter()
                    for _ in range(batches):
                        await way()
                    rates[name].append(batches * BATCH / (time.perf_counter() - began))
            ceiling = common.median(rates["raw XADD, one pipeline (ceiling)"])
            for name, values in rates.items():
                rate = common.median(values)
                rows.append([f"{spread} sessions", name, rate, rate / ceiling])
        await store.aclose()
    text = common.table(
        f"Batches of {BATCH} events on a 3-master Redis Cluster (events/s, median of {rounds})",
        ["batch over", "way", "events/s", "÷ raw XADD"],
        rows,
    )
    common.report("cluster", [text], {"quick": args.quick, "rows": rows}, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("cluster", __doc__.splitlines()[0] if __doc__ else "")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
