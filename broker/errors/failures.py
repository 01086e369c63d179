"""Failures an operator can read: one line when a loop starts failing, a summary while it
goes on, one line when it recovers — never a traceback a second.

A loop that retries (reading commands, projecting, renewing leases, reading pub/sub) keeps a
:class:`FailureLog` and calls :meth:`~FailureLog.failed` on each failure and
:meth:`~FailureLog.succeeded` after each success::

    projection failed: ConnectionError: Error 111 connecting to 127.0.0.1:6379.
    projection still failing after 10 s (23 errors): ConnectionError: ...
    projection recovered after 12 s (27 errors)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..ops import metrics

SUMMARY_INTERVAL = 10.0
"""Seconds between the summaries of a failure that goes on."""


def describe(exc: BaseException) -> str:
    """An exception as one line: its class and its message."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class FailureLog:
    """Logs a retrying loop's failures to ``logger`` under the name ``what``."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.logger = logger
        self.what = what
        self.clock = clock
        self.on_failure = on_failure
        self.since: float | None = None
        self.errors = 0
        self._summarized = 0.0

    @property
    def failing(self) -> bool:
        """Whether the last attempt failed."""
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        """One more failure: a line for the first, a summary now and then for the rest."""
        now = self.clock()
        self.errors += 1
        metrics.REDIS_ERRORS.labels(self.what).inc()
        if self.on_failure is not None:
            self.on_failure(exc)
        if self.since is None:
            self.since = self._summarized = now
            self.logger.error("%s failed: %s", self.what, describe(exc))
        elif now - self._summarized >= SUMMARY_INTERVAL:
            self._summarized = now
            self.logger.error(
                "%s still failing after %.0f s (%d errors): %s",
                self.what,
                now - self.since,
                self.errors,
                describe(exc),
            )

    def succeeded(self) -> None:
        """An attempt worked: a line if it ends a failure."""
        if self.since is None:
            return
        metrics.REDIS_RECOVERIES.labels(self.what).inc()
        self.logger.warning(
            "%s recovered after %.1f s (%d errors)",
            self.what,
            self.clock() - self.since,
            self.errors,
        )
        self.since, self.errors = None, 0
