"""What a store briefly out of reach raises, for trying again (:mod:`broker.retry`).

A restart, a failover, a stall or a Redis Cluster moving slots makes commands fail for a few
seconds. A write that carries someone's answer or reply is tried again (the same bytes: the
reader deduplicates by the id inside) with a growing pause, until a deadline; past it the
last error is raised, for the caller to report. The loop and its pauses are
:mod:`broker.retry`'s; :func:`retrying` and :func:`retry_store` are it with the store's
errors (:data:`RETRIED`) by default.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from redis.exceptions import (
    AskError,
    ClusterError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import retry as retry_helper
from ..retry import doubling as doubling  # where the store's callers find it
from .errors import StoreUnavailable

T = TypeVar("T")

STORE_MOVING = (ClusterError, TryAgainError, AskError, SlotNotCoveredError)
"""What a Redis Cluster raises while it moves slots or fails over, for a command it did not
run: CLUSTERDOWN (``ClusterDownError``, a ``ClusterError``), TRYAGAIN (a multi-key command
or script whose keys are split between a migrating slot's two nodes), MOVED and ASK
(``MovedError`` is an ``AskError``) when redis-py gives up following them, and
``ClusterError("TTL exhausted")``, what redis-py raises once it has been redirected or told
to try again 16 times in a row (about half a second): a slot half migrated lasts longer."""

REDIS_AWAY = (RedisConnectionError, RedisTimeoutError, OSError, ReadOnlyError, *STORE_MOVING)
"""What the client raises for a store that is out of reach (restarting, loading its data,
stalled, failing over: a master turned replica answers writes ``READONLY``, and the write
did not run; a cluster moving slots); any other error reply to a command is not among them:
trying it again would fail again. A port raises them as :class:`~.errors.StoreUnavailable`."""

STORE_AWAY = (StoreUnavailable, OSError)
"""What a port raises for a store that is out of reach (:data:`REDIS_AWAY` as the store's
own class; a socket's error as it came): what a role catches to try again."""

RETRIED = STORE_AWAY + REDIS_AWAY
"""What :func:`retrying` and :func:`retry_store` try again unless told otherwise: a port's
"out of reach", and the client's own where the store retries its commands itself."""

AWAY_REPLIES = ("UNBLOCKED", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN")
"""Error replies a server gives while its role changes (they say "not now", not "never"):
a blocked command released as the master turns replica (``UNBLOCKED``), a replica whose
master link is down (``MASTERDOWN``), a master without its ``min-replicas-to-write``
(``NOREPLICAS``), keys being moved (``TRYAGAIN``). redis-py raises most of them as a plain
:class:`~redis.exceptions.ResponseError`."""


def is_store_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the store is out of reach for now (:data:`STORE_AWAY`, one of
    :data:`AWAY_REPLIES`, or a cluster client's "cannot be connected" caused by one): the
    one test of it, for what clients hear on every role."""
    if isinstance(exc, RETRIED):  # MASTERDOWN and TRYAGAIN among them (cluster errors)
        return True
    if isinstance(exc, RedisClusterException) and exc.__cause__ is not None:
        # A cluster client that reached no node to reload its slot map from says so with
        # this, the last node's error as its cause.
        return is_store_away(exc.__cause__)
    return isinstance(exc, ResponseError) and str(exc).startswith(AWAY_REPLIES)


async def retrying(
    call: Callable[[], Awaitable[T]],
    deadline: float,
    errors: tuple[type[BaseException], ...] = RETRIED,
    *,
    again: Callable[[T], bool] | None = None,
) -> T:
    """:func:`broker.retry.retrying` with the store's errors (:data:`RETRIED`) unless
    told others: ``await call()`` again after each, for at most ``deadline`` seconds."""
    return await retry_helper.retrying(call, deadline, errors, again=again)


async def retry_store(
    call: Callable[[], Awaitable[T]],
    pauses: Iterable[float],
    *,
    keep: Callable[[BaseException], bool] | None = None,
    errors: tuple[type[BaseException], ...] = RETRIED,
    again: Callable[[T], bool] | None = None,
) -> T:
    """:func:`broker.retry.retry` with the store's errors (:data:`RETRIED`) unless told
    others: ``await call()`` again after each, waiting each of ``pauses`` in turn."""
    return await retry_helper.retry(call, pauses, errors=errors, keep=keep, again=again)


def unheard(receivers: int) -> bool:
    """For :func:`retrying`'s ``again``: a message that reached no subscriber (a front whose
    subscription is being made again after Redis came back: it hears the next try)."""
    return int(receivers) == 0
