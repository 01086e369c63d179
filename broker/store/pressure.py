"""How full Redis is: what ``/readyz`` says about the store.

A Redis at ``maxmemory`` still serves every read, so a full store leaves a node ready
(taking every node out of service would stop the reads too) and says why writes fail;
an unreachable Redis makes it not ready. A ``maxmemory`` with any policy but
``noeviction`` is reported: Redis would evict sessions' logs and snapshots.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import RedisError

from ..ops import metrics
from .client import Store

READY_TIMEOUT = 2.0
"""Seconds Redis has to answer the readiness check."""


async def store_readiness(redis: Store) -> tuple[bool, str]:
    """``(ready, one line saying why)`` for this node's store."""
    try:
        info = await asyncio.wait_for(redis.info("memory"), READY_TIMEOUT)
    except (RedisError, OSError, TimeoutError) as exc:
        return False, f"not ready: Redis cannot be reached ({exc})"
    nodes = info.values() if all(isinstance(v, dict) for v in info.values()) else [info]
    _measure(list(nodes))
    notes = [note for node in nodes if (note := _memory_note(node))]
    return True, "; ".join(["ready", *notes])


def _measure(nodes: list[dict[str, Any]]) -> None:
    """The store's memory as metrics (a cluster: summed over its masters)."""
    used = [int(node.get("used_memory", 0)) for node in nodes]
    limits = [int(node.get("maxmemory", 0)) for node in nodes]
    metrics.STORE_USED.set(sum(used))
    metrics.STORE_LIMIT.set(sum(limits))
    full = any(limit and u >= limit for u, limit in zip(used, limits, strict=True))
    metrics.STORE_FULL.set(1 if full else 0)


def _memory_note(node: dict[str, Any]) -> str | None:
    used, limit = int(node.get("used_memory", 0)), int(node.get("maxmemory", 0))
    policy = str(node.get("maxmemory_policy", "noeviction"))
    if limit and used >= limit:
        return (
            f"store full: used_memory {used} >= maxmemory {limit}, writes are refused "
            "until space is freed (acp-broker archive), reads keep working"
        )
    if limit and policy != "noeviction":
        return f"warning: maxmemory-policy is {policy}; use noeviction (it evicts sessions)"
    return None
