"""Appends that wait for replicas: an acknowledged event survives the loss of the master.

Redis replicates asynchronously: a write the master acknowledged and had not yet sent on is
lost when the master dies and a replica takes over (a Sentinel failover). With the setting
``redis_wait_replicas`` = N, each append is followed, on the same connection, by
``WAIT N timeout``, and the client is told it succeeded only once N replicas have it. An
append that fewer replicas acknowledged in time raises :class:`NotReplicated`: a store
error, which the agent host tries again (the append's call id makes the second try append
nothing more, and wait again) and a client is told as "try again".

Not on a Redis Cluster (``WAIT`` goes to no key's node there): see docs/redis.md.
"""

from __future__ import annotations

from typing import Any

from redis.commands.core import AsyncScript

from .client import Store, commands
from .errors import StoreUnavailable


class NotReplicated(StoreUnavailable):
    """An append that fewer replicas than asked acknowledged within the timeout."""


async def replicated(
    redis: Store,
    script: AsyncScript,
    keys: list[str],
    args: list[Any],
    *,
    replicas: int,
    timeout: float,
) -> Any:
    """``script``'s reply, once ``replicas`` replicas have acknowledged what it wrote
    (``WAIT`` in the same pipeline: it counts this connection's writes)."""
    async with commands(redis).pipeline(transaction=False) as pipe:
        await script(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", replicas, max(1, int(timeout * 1000)))
        reply, acknowledged = await pipe.execute()
    if int(acknowledged) < replicas:
        raise NotReplicated(
            f"the append reached {acknowledged} of {replicas} replicas within {timeout:g} s "
            "(redis_wait_replicas)"
        )
    return reply
