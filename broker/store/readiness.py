"""Whether the store can take this role's writes now: the ``redis`` check of ``/readyz``.

A write to a key of the broker's own (and a publish on a channel of its own) is the probe:
it fails on a read-only replica (a failover demoted the server), on a missing ACL
permission and while the master is being replaced, each with its reason: the node is not
ready, for reasons of its own (another node may reach another master, or have its rights).

A full Redis (``maxmemory`` reached, ``noeviction``) refuses the probe's write too, but the
node stays ready, with a note saying the store is full: reads (lists, loads, the console)
still work, every node shares the condition, and a load balancer that took every node out
of rotation would serve nothing at all. The ``acp_broker_store_full`` gauge and the
``acp_broker_writes_refused_total`` counter say it to the operator.
It needs no ``@dangerous`` command (``INFO`` and ``ROLE`` are), so a least-privilege user
becomes ready. Where the user may run ``INFO``, the store's memory is measured too (the
``acp_broker_store_*`` metrics) and an evicting ``maxmemory-policy`` is noticed even if it
was set after start-up.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from redis.exceptions import RedisError

from ..ops import metrics
from ..ops.health import Unhealthy
from .client import Store, Topology, commands, topology
from .faults import is_noperm, write_problem
from .log_errors import is_oom
from .preflight import PROBE_CHANNEL, StoreFacts, evicting_refusal, evicting_warning

PROBE_KEY = "acpb:{probe}:ready:" + socket.gethostname()
"""The key each process writes to prove the store takes writes (it expires by itself)."""


class StoreReadiness:
    """The ``redis`` readiness check of one process (see the module)."""

    def __init__(self, redis: Store, *, allow_evicting: bool = False) -> None:
        self.redis = commands(redis)
        self.allow_evicting = allow_evicting
        self.facts = StoreFacts()
        """What the start-up checks found (set by the role once they ran)."""
        self._info_allowed = True

    async def __call__(self) -> str | None:
        """A note (or None) when the store takes writes; :class:`Unhealthy` with the
        reason when it does not."""
        if topology(self.redis) is Topology.EMBEDDED:
            await self.redis.ping()
            return None
        try:
            await self.redis.set(PROBE_KEY, "1", px=10_000)
            await self.redis.spublish(PROBE_CHANNEL, "ready?")
        except (RedisError, OSError) as exc:
            if not is_oom(exc):
                raise Unhealthy(write_problem(exc)) from None
            metrics.STORE_FULL.set(1)  # shared by every node: ready, saying so (see module)
            return "; ".join([write_problem(exc), *await self._memory_notes(full=True)])
        notes = await self._memory_notes()
        return "; ".join(notes) or None

    async def _memory_notes(self, *, full: bool = False) -> list[str]:
        """Notes on the store's memory (and the metrics); ``full``: the probe's write was
        refused at ``maxmemory`` (else it went through: the store is not full)."""
        policies = [self.facts.policy] if self.facts.policy else []
        if not self._info_allowed:
            metrics.STORE_FULL.set(int(full))
        else:
            try:
                info = await asyncio.wait_for(self.redis.info("memory"), 2.0)
            except RedisError as exc:
                if not is_noperm(exc):
                    raise
                self._info_allowed = False  # least privilege: no metrics, no more asking
            else:
                nodes = [v for v in info.values() if isinstance(v, dict)] or [info]
                _measure(nodes, full=full)
                policies = [str(node.get("maxmemory_policy", "noeviction")) for node in nodes]
        evicting = [policy for policy in policies if policy != "noeviction"]
        if evicting and not self.allow_evicting:
            raise Unhealthy(evicting_refusal(evicting[0]))
        return [evicting_warning(evicting[0])] if evicting else []


def _measure(nodes: list[dict[str, Any]], *, full: bool) -> None:
    """The store's memory as metrics (a cluster: summed over its masters); ``full``: a
    write was just refused at ``maxmemory`` (whatever the figures say)."""
    used = [int(node.get("used_memory", 0)) for node in nodes]
    limits = [int(node.get("maxmemory", 0)) for node in nodes]
    metrics.STORE_USED.set(sum(used))
    metrics.STORE_LIMIT.set(sum(limits))
    full = full or any(limit and u >= limit for u, limit in zip(used, limits, strict=True))
    metrics.STORE_FULL.set(1 if full else 0)
