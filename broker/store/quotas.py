"""Per-tenant bounds checked before a write (the per-session one is in the append script),
and the rate counters every node adds a credential's requests to."""

from __future__ import annotations

from .boundary import port, translated
from .client import Store, commands
from .keys import TenantKeys


class TenantFull(Exception):
    """The tenant has as many sessions as ``max_sessions_per_tenant`` allows."""


@translated
async def check_session_quota(redis: Store, tenant: str, limit: int) -> None:
    """Raise :class:`TenantFull` when ``tenant`` has ``limit`` sessions or more.

    Sessions are counted by their index rows (one per session, deleted ones until they
    are purged), which ``session/new`` projects at once: one HLEN, no scan."""
    count = await commands(redis).hlen(TenantKeys(tenant).rows)
    if count >= limit:
        raise TenantFull(
            f"the tenant has {count} sessions and max_sessions_per_tenant is {limit}: "
            "delete sessions (they are purged after deleted_retention) or raise the bound"
        )


@port
class RateCounters:
    """Counters every node adds to (requests in a window), each kept a few seconds."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)

    async def add(self, key: str, amount: int, ttl: int) -> int:
        """Add ``amount`` to the counter ``key`` and keep it ``ttl`` seconds from now (in one
        round trip); its total."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.incrby(key, amount)
            pipe.expire(key, ttl)
            total, _ = await pipe.execute()
        return int(total)
