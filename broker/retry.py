"""Trying again: the one helper for every wait-and-retry of the code base.

A call that failed for a reason that passes (a store restarting or failing over, a broker
node being replaced, a concurrent request not finished yet) is made again after a pause,
until it succeeds, the pauses run out or a deadline passes; then the last error (or the
last result) is the caller's to report. What counts as "passes" is the caller's to say:
the store's errors are classified in :mod:`broker.store.retry`.

* :func:`retry`: the loop, over any sequence of pauses;
* :func:`retrying`: the loop bounded by a deadline (the pauses double up to a cap);
* the pauses: :func:`doubling` (the store's, and redis-py's reconnecting retry through
  :func:`doubling_pause`), :func:`steady` (a poll), :func:`within` (cut at a deadline);
* :class:`Backoff`: the same doubling pauses with jitter, for a caller that keeps its own
  loop (the stdio bridge reconnecting: pure, no I/O, the clock passed in).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = [
    "Backoff",
    "doubling",
    "doubling_pause",
    "retry",
    "retrying",
    "steady",
    "within",
]

T = TypeVar("T")

FIRST_PAUSE = 0.05
"""Seconds of the first pause of :func:`doubling` by default."""
MAX_PAUSE = 1.0
"""Seconds no pause of :func:`doubling` exceeds by default."""


def doubling_pause(
    failures: int, first: float = FIRST_PAUSE, cap: float = MAX_PAUSE, factor: float = 2.0
) -> float:
    """The pause after the ``failures``-th failure in a row (from 1): ``first``, growing
    ``factor`` times each failure, up to ``cap``."""
    return min(cap, first * factor ** max(failures - 1, 0))


def doubling(
    first: float = FIRST_PAUSE, cap: float = MAX_PAUSE, factor: float = 2.0
) -> Iterator[float]:
    """Pauses that double (or grow ``factor`` times) from ``first`` up to ``cap``, without
    end."""
    return (doubling_pause(n, first, cap, factor) for n in itertools.count(1))


def steady(pause: float) -> Iterator[float]:
    """The same pause, without end (a poll)."""
    return itertools.repeat(pause)


def within(pauses: Iterable[float], seconds: float) -> Iterator[float]:
    """``pauses`` while one would end within ``seconds`` from now (the event loop's clock,
    read now: the deadline counts from the first call, not the first failure)."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + seconds

    def cut() -> Iterator[float]:
        for pause in pauses:
            if loop.time() + pause > give_up:
                return
            yield pause

    return cut()


async def retry(
    call: Callable[[], Awaitable[T]],
    pauses: Iterable[float],
    *,
    errors: tuple[type[BaseException], ...] = (),
    keep: Callable[[BaseException], bool] | None = None,
    again: Callable[[T], bool] | None = None,
) -> T:
    """``await call()``, again after each of ``errors``, waiting each of ``pauses`` in turn
    (endless: until it succeeds); when they run out, or ``keep`` (asked after each failure)
    says False, the last error is raised. A result ``again`` holds for is not the one
    wanted either (a message no subscriber heard, a request still pending): tried again
    the same way, and returned when the pauses run out."""
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


async def retrying(
    call: Callable[[], Awaitable[T]],
    deadline: float,
    errors: tuple[type[BaseException], ...],
    *,
    again: Callable[[T], bool] | None = None,
    pauses: Iterable[float] | None = None,
) -> T:
    """:func:`retry` for at most ``deadline`` seconds in all, with :func:`doubling` pauses
    (or ``pauses``); then the last error is raised, or the last result returned."""
    return await retry(
        call, within(doubling() if pauses is None else pauses, deadline), errors=errors, again=again
    )


@dataclass
class Backoff:
    """Pauses between attempts for a caller with a loop of its own, and the bound past which
    it gives up: the stdio bridge reconnecting to the broker.

    Attempt 1 goes at once (a replacement node is often there already); attempt ``n > 1``
    waits a random time between half and all of :func:`doubling_pause` ``(n - 1)`` (from
    ``initial``, ``factor`` times more each attempt, up to ``maximum``), so that the
    bridges of a node that went away do not all come back in the same instant.
    """

    give_up_after: float = 60.0
    initial: float = 0.1
    factor: float = 2.0
    maximum: float = 1.0
    uniform: Callable[[], float] = field(default=random.random, repr=False)
    """A number in [0, 1): the jitter (injected by tests)."""
    _attempts: int = 0
    _since: float | None = None

    def __post_init__(self) -> None:
        if self.give_up_after < 0 or self.initial <= 0 or self.factor < 1 or self.maximum <= 0:
            raise ValueError("backoff needs give_up_after >= 0, initial > 0, factor >= 1, max > 0")

    def delay(self, now: float) -> float | None:
        """The pause before the next attempt, made at monotonic time ``now``; None when the
        other side has been out of reach for ``give_up_after`` seconds (give up)."""
        if self._since is None:
            self._since = now
        waited = now - self._since
        if waited >= self.give_up_after and self._attempts > 0:
            return None
        self._attempts += 1
        if self._attempts == 1:
            return 0.0
        base = doubling_pause(self._attempts - 1, self.initial, self.maximum, self.factor)
        pause = base / 2 + self.uniform() * base / 2
        # Never past the bound: the last attempt is made at it, not after it.
        return max(0.0, min(pause, self.give_up_after - waited))

    def out_of_reach_for(self, now: float) -> float:
        """Seconds since the first failed attempt of this outage (0 when none failed)."""
        return 0.0 if self._since is None else now - self._since

    def reset(self) -> None:
        """The other side was reached: the next outage starts from the first attempt again."""
        self._attempts, self._since = 0, None
