"""What a role checks of its store before it says "ready": it refuses, in one line, what
would lose data or fail every request later.

* every command the broker sends, on keys and a channel of its own (``acpb:{probe}:…``),
  so that a user missing a permission is named at once (``NOPERM`` would otherwise hang
  requests until their deadline, or lose pub/sub messages);
* ``maxmemory-policy``: any policy but ``noeviction`` lets Redis drop sessions' logs and
  snapshots silently when it fills up. Refused unless the operator allows it
  (``--allow-evicting-store``), then warned about every minute. A user that may not run
  ``CONFIG GET`` (least privilege: it is ``@dangerous``) gets a warning that the policy
  could not be checked;
* a connection that fails the way a TLS port answers a plain one, or an untrusted
  certificate, gets its fix in the error.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors.failures import describe
from .client import Store, Topology, commands, topology
from .errors import StoreError
from .faults import is_noperm, missing_permission, start_problem
from .own_client import OwnClient
from .raw import RawConnection

log = logging.getLogger(__name__)

NOEVICTION = "noeviction"
_OWN = secrets.token_hex(6)
"""This process's own probe keys: roles started together run their checks at once, and one's
``DEL`` between another's ``XADD`` and ``XGROUP CREATE`` refused that role's start."""
_K, _H, _Z, _T, _S, _N = (
    f"acpb:{{probe}}:{_OWN}:{kind}" for kind in ("k", "h", "z", "t", "s", "n")
)
PROBE_CHANNEL = "acpb:{probe}:channel"
_SCRIPT = "return redis.call('SET', KEYS[1], ARGV[1], 'PX', 10000)"
_PROBES: list[tuple[str, ...]] = [
    ("DEL", _K, _H, _Z, _T, _S, _N),
    ("SET", _K, "1", "PX", "10000"),
    ("GET", _K),
    ("EXISTS", _K),
    ("PEXPIRE", _K, "10000"),
    ("INCRBY", _N, "1"),
    ("HSET", _H, "f", "1"),
    ("HGET", _H, "f"),
    ("HMGET", _H, "f"),
    ("HGETALL", _H),
    ("HLEN", _H),
    ("HKEYS", _H),
    ("HDEL", _H, "f"),
    ("ZADD", _Z, "1", "m"),
    ("ZRANGE", _Z, "0", "-1"),
    ("ZRANGEBYSCORE", _Z, "-inf", "+inf"),
    ("ZREM", _Z, "m"),
    ("SADD", _T, "m"),
    ("SMEMBERS", _T),
    ("XADD", _S, "MAXLEN", "1", "*", "f", "1"),
    ("XRANGE", _S, "-", "+"),
    ("XREVRANGE", _S, "+", "-", "COUNT", "1"),
    ("XREAD", "COUNT", "1", "STREAMS", _S, "0"),
    ("XGROUP", "CREATE", _S, "g", "0"),
    ("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", _S, ">"),
    ("XPENDING", _S, "g"),
    ("XAUTOCLAIM", _S, "g", "c", "0", "0-0", "COUNT", "1"),
    ("XACK", _S, "g", "0-1"),
    ("XTRIM", _S, "MAXLEN", "1"),
    ("EVAL", _SCRIPT, "1", _K, "1"),
    ("SPUBLISH", PROBE_CHANNEL, "probe"),
    ("DEL", _K, _H, _Z, _T, _S, _N),
]
"""Every kind of command the roles send, on probe keys sharing one hash tag."""


class StoreRefused(StoreError):
    """The store cannot be used as it is: the message says why and how to fix it."""


@dataclass
class StoreFacts:
    """What the start-up checks found."""

    policy: str | None = NOEVICTION
    """``maxmemory-policy``; None when it could not be checked."""
    warnings: list[str] = field(default_factory=list)

    @property
    def evicting(self) -> bool:
        return self.policy not in (None, NOEVICTION)


async def preflight(redis: Store, *, allow_evicting: bool, tls: bool) -> StoreFacts:
    """Check the store (see the module); raises :class:`StoreRefused` or a connection error
    carrying its fix. ``tls``: whether the store URL asked for TLS."""
    if topology(redis) is Topology.EMBEDDED:
        return StoreFacts()
    try:
        await commands(redis).ping()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise RedisConnectionError(start_problem(exc, tls=tls)) from exc
    await check_permissions(redis)
    facts = StoreFacts(policy=await eviction_policy(redis))
    if facts.policy is None:
        facts.warnings.append(
            "could not check the store's maxmemory-policy (this Redis user may not run "
            "CONFIG GET): make sure it is noeviction, or Redis may evict sessions when full"
        )
    elif facts.evicting and not allow_evicting:
        raise StoreRefused(evicting_refusal(facts.policy))
    elif facts.evicting:
        facts.warnings.append(evicting_warning(facts.policy))
    for warning in facts.warnings:
        log.warning("%s", warning)
    return facts


def evicting_refusal(policy: str) -> str:
    return (
        f"the store's maxmemory-policy is {policy}: a full Redis would evict sessions' logs "
        "without a word. Set it to noeviction (CONFIG SET maxmemory-policy noeviction, and "
        "in redis.conf), or start with --allow-evicting-store to run anyway"
    )


def evicting_warning(policy: str) -> str:
    return (
        f"the store's maxmemory-policy is {policy} (allowed by --allow-evicting-store): "
        "a full Redis evicts sessions' logs; set it to noeviction"
    )


async def check_permissions(redis: Store) -> None:
    """Run every kind of command the broker sends on probe keys; a ``NOPERM`` reply is
    refused naming the permission."""
    for probe in _PROBES:
        try:
            await commands(redis).execute_command(*probe)
        except ResponseError as exc:
            if is_noperm(exc) or "can't access" in str(exc):
                raise StoreRefused(missing_permission(exc, probe[0])) from None
            if not str(exc).startswith("BUSYGROUP"):
                raise StoreRefused(f"the store refused {probe[0]}: {describe(exc)}") from None
    await _check_subscribe(redis)


async def _check_subscribe(redis: Store) -> None:
    """SSUBSCRIBE on a probe channel (a refusal comes as the reply to it)."""
    if topology(redis) is Topology.CLUSTER:
        return  # the cluster's pub/sub client subscribes lazily; SPUBLISH proved the channel
    if isinstance(redis, OwnClient):
        connection: RawConnection = await redis.connections.dedicated()
        try:  # RESP2: the confirmation is the command's reply
            await connection.call("SSUBSCRIBE", PROBE_CHANNEL)
        except ResponseError as exc:
            if is_noperm(exc):
                raise StoreRefused(missing_permission(exc, "SSUBSCRIBE")) from None
            raise
        finally:
            connection.close()
        return
    pubsub = commands(redis).pubsub()
    try:
        await pubsub.ssubscribe(PROBE_CHANNEL)
        async with asyncio.timeout(5):
            while (await pubsub.get_message(timeout=1.0)) is None:
                pass
    except ResponseError as exc:
        if is_noperm(exc):
            raise StoreRefused(missing_permission(exc, "SSUBSCRIBE")) from None
        raise
    finally:
        await pubsub.aclose()


async def eviction_policy(redis: Store) -> str | None:
    """The store's ``maxmemory-policy`` (a cluster: the first evicting one among its
    nodes); None when this user may not ask (``CONFIG GET`` is ``@dangerous``)."""
    try:
        answer = await commands(redis).config_get("maxmemory-policy")
    except ResponseError as exc:
        if is_noperm(exc):
            return None
        raise
    values = answer.values() if isinstance(answer, dict) else []
    policies = [
        str(value.get("maxmemory-policy")) if isinstance(value, dict) else str(value)
        for value in values
    ]
    evicting = [policy for policy in policies if policy != NOEVICTION]
    return evicting[0] if evicting else NOEVICTION


async def warn_while_evicting(policy: str, interval: float = 60.0) -> None:
    """Log :func:`evicting_warning` every ``interval`` seconds (until cancelled)."""
    while True:
        await asyncio.sleep(interval)
        log.warning("%s", evicting_warning(policy))
