"""Trying a Redis write again while the store is briefly out of reach.

A restart, a failover or a stall makes commands fail for a few seconds. A write that carries
someone's answer or reply is tried again (the same bytes: the reader deduplicates by the id
inside) with a growing pause, until a deadline; past it the last error is raised, for the
caller to report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MasterDownError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

T = TypeVar("T")

STORE_AWAY = (RedisConnectionError, RedisTimeoutError, OSError, ReadOnlyError)
"""What a store that is out of reach raises (restarting, loading its data, stalled, failing
over: a master turned replica answers writes ``READONLY``, and the write did not run); any
other error reply to a command is not among them: trying it again would fail again."""

AWAY_REPLIES = ("UNBLOCKED", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN")
"""Error replies a server gives while its role changes (they say "not now", not "never"):
a blocked command released as the master turns replica (``UNBLOCKED``), a replica whose
master link is down (``MASTERDOWN``), a master without its ``min-replicas-to-write``
(``NOREPLICAS``), keys being moved (``TRYAGAIN``). redis-py raises most of them as a plain
:class:`~redis.exceptions.ResponseError`."""


def is_store_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the store is out of reach for now (:data:`STORE_AWAY`, or one
    of :data:`AWAY_REPLIES`): the one test of it, for retrying and for what clients hear."""
    if isinstance(exc, (*STORE_AWAY, MasterDownError)):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(AWAY_REPLIES)


FIRST_PAUSE = 0.05
MAX_PAUSE = 1.0


async def retrying(call: Callable[[], Awaitable[T]], deadline: float) -> T:
    """``await call()``, again after each error of :data:`STORE_AWAY`, for at most
    ``deadline`` seconds in all; then the last error is raised."""
    loop = asyncio.get_running_loop()
    return await retry_store(call, _within(loop, loop.time() + deadline))


async def retry_store(
    call: Callable[[], Awaitable[T]],
    pauses: Iterable[float],
    *,
    keep: Callable[[BaseException], bool] | None = None,
) -> T:
    """``await call()``, again after each error :func:`is_store_away` names, waiting each of
    ``pauses`` in turn (endless: until the store answers); when they run out, or ``keep``
    (asked after each failure) says False, the last error is raised."""
    left = iter(pauses)
    while True:
        try:
            return await call()
        except (*STORE_AWAY, ResponseError) as exc:
            if not is_store_away(exc):
                raise
            pause = next(left, None)
            if pause is None or (keep is not None and not keep(exc)):
                raise
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
