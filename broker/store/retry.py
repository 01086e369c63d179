"""Trying a Redis write again while the store is briefly out of reach.

A restart, a failover, a stall or a Redis Cluster moving slots makes commands fail for a few
seconds. A write that carries someone's answer or reply is tried again (the same bytes: the
reader deduplicates by the id inside) with a growing pause, until a deadline; past it the
last error is raised, for the caller to report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
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

T = TypeVar("T")

STORE_MOVING = (ClusterError, TryAgainError, AskError, SlotNotCoveredError)
"""What a Redis Cluster raises while it moves slots or fails over, for a command it did not
run: CLUSTERDOWN (``ClusterDownError``, a ``ClusterError``), TRYAGAIN (a multi-key command
or script whose keys are split between a migrating slot's two nodes), MOVED and ASK
(``MovedError`` is an ``AskError``) when redis-py gives up following them, and
``ClusterError("TTL exhausted")``, what redis-py raises once it has been redirected or told
to try again 16 times in a row (about half a second): a slot half migrated lasts longer."""

STORE_AWAY = (RedisConnectionError, RedisTimeoutError, OSError, ReadOnlyError, *STORE_MOVING)
"""What a store that is out of reach raises (restarting, loading its data, stalled, failing
over: a master turned replica answers writes ``READONLY``, and the write did not run; a
cluster moving slots); any other error reply to a command is not among them: trying it
again would fail again."""

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
    if isinstance(exc, STORE_AWAY):  # MASTERDOWN and TRYAGAIN among them (cluster errors)
        return True
    if isinstance(exc, RedisClusterException) and exc.__cause__ is not None:
        # A cluster client that reached no node to reload its slot map from says so with
        # this, the last node's error as its cause.
        return is_store_away(exc.__cause__)
    return isinstance(exc, ResponseError) and str(exc).startswith(AWAY_REPLIES)


FIRST_PAUSE = 0.05
MAX_PAUSE = 1.0


async def retrying(
    call: Callable[[], Awaitable[T]],
    deadline: float,
    errors: tuple[type[BaseException], ...] = STORE_AWAY,
    *,
    again: Callable[[T], bool] | None = None,
) -> T:
    """``await call()``, again after each of ``errors`` (default :data:`STORE_AWAY`), for at
    most ``deadline`` seconds in all; then the last error is raised. ``again``: a result it
    holds for is not the one wanted either (a message published that no subscriber heard):
    tried again the same way, and past the deadline the last such result is returned."""
    loop = asyncio.get_running_loop()
    pauses = _within(loop, loop.time() + deadline)
    return await retry_store(call, pauses, errors=errors, again=again)


async def retry_store(
    call: Callable[[], Awaitable[T]],
    pauses: Iterable[float],
    *,
    keep: Callable[[BaseException], bool] | None = None,
    errors: tuple[type[BaseException], ...] = STORE_AWAY,
    again: Callable[[T], bool] | None = None,
) -> T:
    """``await call()``, again after each of ``errors`` (default :data:`STORE_AWAY`), waiting
    each of ``pauses`` in turn (endless: until the store answers); when they run out, or
    ``keep`` (asked after each failure) says False, the last error is raised. A result
    ``again`` holds for is tried again the same way; when the pauses run out it is returned."""
    left = iter(pauses)
    while True:
        try:
            result = await call()
        except errors as exc:
            pause = next(left, None)
            if pause is None or (keep is not None and not keep(exc)):
                raise
        else:
            if again is None or not again(result):
                return result
            pause = next(left, None)
            if pause is None:
                return result
        await asyncio.sleep(pause)


def doubling(first: float = FIRST_PAUSE, cap: float = MAX_PAUSE) -> Iterator[float]:
    """Pauses that double from ``first`` up to ``cap``, without end."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, cap)


def _within(loop: asyncio.AbstractEventLoop, give_up: float) -> Iterator[float]:
    """:func:`doubling` pauses, while one would end by ``give_up`` (a loop time)."""
    for pause in doubling():
        if loop.time() + pause > give_up:
            return
        yield pause


def unheard(receivers: int) -> bool:
    """For :func:`retrying`'s ``again``: a message that reached no subscriber (a front whose
    subscription is being made again after Redis came back: it hears the next try)."""
    return int(receivers) == 0
