"""How many sessions the store holds, hot (their log in Redis) and archived (only what
listing and reopening them need): what an operator sizes Redis by (docs/redis-memory.md).

Counted, not kept: hot sessions are the members of the partitions' hot sets (``ZCARD``,
256 in one pipeline), indexed sessions the fields of the tenants' index rows (``HLEN`` of
each ``…:rows`` key a ``SCAN`` finds); the archived ones are the indexed ones that are not
hot. A count is a pass over the key space (``SCAN``): the projector role takes one every
:data:`CENSUS_INTERVAL` seconds, not on every scrape.
"""

from __future__ import annotations

from dataclasses import dataclass

from .boundary import translated
from .client import Store, commands
from .keys import PARTITIONS, PREFIX, hot_key

CENSUS_INTERVAL = 60.0
"""Seconds at least between two counts."""
ROWS_PATTERN = f"{PREFIX}:{{t:*}}:rows"
"""The tenants' index rows (a hash each, a field per session)."""


@dataclass(frozen=True)
class Census:
    """Sessions in the store."""

    hot: int
    """Sessions whose log is in Redis."""
    indexed: int
    """Sessions the index lists (hot or archived)."""

    @property
    def archived(self) -> int:
        """Sessions whose log is in the archive store only."""
        return max(0, self.indexed - self.hot)


@translated
async def census(redis: Store) -> Census:
    """Count the sessions of the store (see the module's description)."""
    redis = commands(redis)
    async with redis.pipeline(transaction=False) as pipe:
        for partition in range(PARTITIONS):
            pipe.zcard(hot_key(partition))
        hot = sum(int(count) for count in await pipe.execute())
    indexed = 0
    async for key in redis.scan_iter(match=ROWS_PATTERN, count=1000, _type="HASH"):
        indexed += int(await redis.hlen(key))
    return Census(hot=hot, indexed=indexed)
