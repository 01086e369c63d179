"""When the stdio bridge tries to reach the broker again, and where: pure, no I/O.

:class:`Backoff` gives the pause before each attempt (the first at once, then
exponential growth with jitter, capped) and says when to give up: once the broker has
stayed out of reach for ``give_up_after`` seconds. :class:`UrlRing` picks the URL of
each attempt: the one that worked last first, then the next of those given, in turn.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Backoff", "UrlRing"]


@dataclass
class Backoff:
    """Pauses between reconnect attempts, and the bound past which the bridge gives up.

    Attempt 1 goes at once (a replacement node is often there already); attempt ``n > 1``
    waits a random time between half and all of ``min(maximum, initial * factor**(n-2))``,
    so that the bridges of a node that went away do not all come back in the same instant.
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
        broker has been out of reach for ``give_up_after`` seconds (give up)."""
        if self._since is None:
            self._since = now
        waited = now - self._since
        if waited >= self.give_up_after and self._attempts > 0:
            return None
        self._attempts += 1
        if self._attempts == 1:
            return 0.0
        base = min(self.maximum, self.initial * self.factor ** (self._attempts - 2))
        pause = base / 2 + self.uniform() * base / 2
        # Never past the bound: the last attempt is made at it, not after it.
        return max(0.0, min(pause, self.give_up_after - waited))

    def out_of_reach_for(self, now: float) -> float:
        """Seconds since the first failed attempt of this outage (0 when none failed)."""
        return 0.0 if self._since is None else now - self._since

    def reset(self) -> None:
        """The broker was reached: the next outage starts from the first attempt again."""
        self._attempts, self._since = 0, None


@dataclass
class UrlRing:
    """The broker URLs given to the bridge, tried in turn from the one that worked last."""

    urls: Sequence[str]
    _at: int = 0

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("give at least one URL")

    @property
    def current(self) -> str:
        """The URL to try now."""
        return self.urls[self._at]

    def failed(self) -> None:
        """The current URL could not be reached: the next one is tried next."""
        self._at = (self._at + 1) % len(self.urls)
