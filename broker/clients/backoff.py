"""When the stdio bridge tries to reach the broker again, and where: pure, no I/O.

:class:`~broker.retry.Backoff` (the code base's one retry helper, :mod:`broker.retry`)
gives the pause before each attempt (the first at once, then exponential growth with
jitter, capped) and says when to give up: once the broker has stayed out of reach for
``give_up_after`` seconds. :class:`UrlRing` picks the URL of each attempt: the one that
worked last first, then the next of those given, in turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..retry import Backoff

__all__ = ["Backoff", "UrlRing"]


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
