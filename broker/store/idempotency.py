"""The ``Idempotency-Key`` records of ``POST /v1/sessions``: one per tenant and key, each
a short text (the request's fingerprint and, once made, the session's id) with a time to
live. A record is claimed with a lease and fenced by the pending value its claimer wrote:
the renewal, the settle and the forget change it only while that value is still there.
What the records mean is :mod:`broker.front.http.idempotency`'s."""

from __future__ import annotations

import hashlib

from .boundary import port
from .client import Store, commands
from .keys import PREFIX

_RENEW = """if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0"""
_SETTLE = """if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) return 1 end
return 0"""
_FORGET = """if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1]) end
return 0"""


def idempotency_key(tenant: str, key: str) -> str:
    """The Redis key of a tenant's ``Idempotency-Key`` (hashed: any text, fixed length)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{PREFIX}:idem:{tenant}:{digest}"


@port
class IdempotencyRecords:
    """Claim, read, renew, settle and let go of a tenant's ``Idempotency-Key`` records."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)

    async def claim(self, tenant: str, key: str, pending: str, lease_ms: int) -> bool:
        """Write ``pending`` for ``key`` for ``lease_ms`` unless it has a record; whether
        this call wrote it."""
        name = idempotency_key(tenant, key)
        return bool(await self.redis.set(name, pending, nx=True, px=lease_ms))

    async def get(self, tenant: str, key: str) -> str | None:
        """``key``'s record (None: none, or lapsed)."""
        value = await self.redis.get(idempotency_key(tenant, key))
        return None if value is None else str(value)

    async def renew(self, tenant: str, key: str, pending: str, lease_ms: int) -> bool:
        """Extend the claim by ``lease_ms`` while it still holds ``pending``; whether it did."""
        return await self._fenced(_RENEW, tenant, key, pending, lease_ms)

    async def settle(self, tenant: str, key: str, pending: str, value: str, ttl: int) -> bool:
        """Replace the claim ``pending`` with ``value`` for ``ttl`` seconds; whether the claim
        still held the key."""
        return await self._fenced(_SETTLE, tenant, key, pending, value, ttl)

    async def forget(self, tenant: str, key: str, pending: str) -> bool:
        """Delete the record while it still holds the claim ``pending``."""
        return await self._fenced(_FORGET, tenant, key, pending)

    async def _fenced(self, script: str, tenant: str, key: str, *args: str | int) -> bool:
        name = idempotency_key(tenant, key)
        return bool(await self.redis.eval(script, 1, name, *args))
