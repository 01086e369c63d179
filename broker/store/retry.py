"""Trying a Redis write again while the store is briefly out of reach.

A restart, a failover or a stall makes commands fail for a few seconds. A write that carries
someone's answer or reply is tried again (the same bytes: the reader deduplicates by the id
inside) with a growing pause, until a deadline; past it the last error is raised, for the
caller to report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

T = TypeVar("T")

STORE_AWAY = (RedisConnectionError, RedisTimeoutError, OSError, ReadOnlyError)
"""What a store that is out of reach raises (restarting, loading its data, stalled, failing
over: a master turned replica answers writes ``READONLY``, and the write did not run); any
other error reply to a command is not among them: trying it again would fail again."""

FIRST_PAUSE = 0.05
MAX_PAUSE = 1.0


async def retrying(call: Callable[[], Awaitable[T]], deadline: float) -> T:
    """``await call()``, again after each error of :data:`STORE_AWAY`, for at most
    ``deadline`` seconds in all; then the last error is raised."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline
    pause = FIRST_PAUSE
    while True:
        try:
            return await call()
        except STORE_AWAY:
            if loop.time() + pause > give_up:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE)
