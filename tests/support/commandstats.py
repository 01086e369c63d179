"""What a broker sends its Redis, counted by the servers themselves (``INFO commandstats``):
the calls of each command on a set of servers, and the difference between two readings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import redis


def command_calls(ports: Sequence[int]) -> Counter[str]:
    """The calls of each command (``xreadgroup``, ``command|getkeys``…) the servers at
    ``ports`` have run since they started, summed. Blocking. Each reading costs each server
    one ``INFO``, which the next reading counts (:func:`calls_between` takes them out)."""
    total: Counter[str] = Counter()
    for port in ports:
        with redis.Redis(port=port, decode_responses=True, socket_timeout=5) as node:
            stats = node.info("commandstats")
        for name, fields in stats.items():
            total[name.removeprefix("cmdstat_")] += int(fields["calls"])
    return total


def calls_between(before: Counter[str], after: Counter[str], servers: int) -> Counter[str]:
    """The calls of each command made between two readings of :func:`command_calls` on
    ``servers`` servers, without the first reading's own ``INFO`` (Redis counts a command
    once it has run, so a reading does not count itself)."""
    made = Counter({name: after[name] - before.get(name, 0) for name in after})
    made["info"] -= servers
    return +made
