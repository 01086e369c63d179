"""The ``Idempotency-Key`` records of ``POST /v1/sessions``: one per tenant and key, each
a short text (the request's fingerprint and, once made, the session's id) with a time to
live. What they mean is :mod:`broker.front.http.idempotency`'s."""

from __future__ import annotations

import hashlib

from .client import Store
from .keys import PREFIX


def idempotency_key(tenant: str, key: str) -> str:
    """The Redis key of a tenant's ``Idempotency-Key`` (hashed: any text, fixed length)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{PREFIX}:idem:{tenant}:{digest}"


class IdempotencyRecords:
    """Claim, read, settle and let go of a tenant's ``Idempotency-Key`` records."""

    def __init__(self, redis: Store) -> None:
        self.redis = redis

    async def claim(self, tenant: str, key: str, value: str, ttl: int) -> bool:
        """Write ``value`` for ``key`` for ``ttl`` seconds unless it has a record; whether
        this call wrote it."""
        return bool(await self.redis.set(idempotency_key(tenant, key), value, nx=True, ex=ttl))

    async def get(self, tenant: str, key: str) -> str | None:
        """``key``'s record (None: none, or lapsed)."""
        value = await self.redis.get(idempotency_key(tenant, key))
        return None if value is None else str(value)

    async def settle(self, tenant: str, key: str, value: str) -> None:
        """Replace ``key``'s record with ``value``, keeping its time to live."""
        await self.redis.set(idempotency_key(tenant, key), value, keepttl=True)

    async def forget(self, tenant: str, key: str) -> None:
        """Delete ``key``'s record."""
        await self.redis.delete(idempotency_key(tenant, key))
