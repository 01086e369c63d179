"""Which agent hosts are alive: each announces itself, and fronts look before running agents.

A host writes its id into one sorted set, scored by when its announcement lapses (ms),
when it starts and every ``lease_ttl / 3`` seconds after (with its leases), and takes it
out when it stops. A front (or ``acp-broker mcp`` over stdio) that is about to have an
agent run asks :func:`any_alive` first, so that with no host it says so at once instead
of waiting out a command's routing deadline.

Beside it: which host holds a session's lease (where a front sends its commands), and what
each agent advertised (its ``agentCapabilities``, written by the host that started it).
"""

from __future__ import annotations

import time

from .boundary import translated
from .client import Store, commands
from .keys import CAPABILITIES_KEY, PREFIX, lease_key

HOSTS_KEY = f"{PREFIX}:hosts:alive"
"""Sorted set: agent host id -> when its announcement lapses (Unix ms)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@translated
async def announce(redis: Store, host_id: str, ttl: float) -> None:
    """``host_id`` is alive for ``ttl`` seconds more (and hosts gone for long are dropped)."""
    now = _now_ms()
    async with commands(redis).pipeline(transaction=False) as pipe:
        pipe.zadd(HOSTS_KEY, {host_id: now + int(ttl * 1000)})
        pipe.zremrangebyscore(HOSTS_KEY, "-inf", now - 3_600_000)
        await pipe.execute()


@translated
async def withdraw(redis: Store, host_id: str) -> None:
    """``host_id`` stopped."""
    await commands(redis).zrem(HOSTS_KEY, host_id)


@translated
async def any_alive(redis: Store) -> bool:
    """Whether some agent host's announcement has not lapsed."""
    return bool(await commands(redis).zcount(HOSTS_KEY, _now_ms(), "+inf"))


@translated
async def publish_capabilities(redis: Store, agent: str, capabilities: str) -> None:
    """What agent ``agent`` advertised (``agentCapabilities``, encoded JSON), for the
    fronts' ``initialize`` answers."""
    await commands(redis).hset(CAPABILITIES_KEY, agent, capabilities)


@translated
async def capabilities(redis: Store) -> dict[str, str]:
    """Every agent's advertised capabilities (encoded JSON) by agent name."""
    return {str(k): str(v) for k, v in (await commands(redis).hgetall(CAPABILITIES_KEY)).items()}


@translated
async def lease_holder(redis: Store, tenant: str, session_id: str) -> str | None:
    """The agent host that holds the session's lease now (None: no host)."""
    holder = await commands(redis).get(lease_key(tenant, session_id))
    return None if holder is None else str(holder)
