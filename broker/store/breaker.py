"""Failing fast while the store is known to be away.

A Redis that is down or stalled makes every command wait for its connection attempt or its
reply timeout (``redis_timeout``, 5 s) before it fails: requests pile up behind it. Once a
role knows the store is away, a :class:`StoreBreaker` makes commands fail at once instead,
with a clear error that the client is told as "the store is unavailable, try again"
(cached ``session/list`` pages are still served: they need no command).

What the breaker knows comes from its probe (:meth:`StoreBreaker.watch`): a ``PING`` every
:data:`INTERVAL` seconds, given :data:`PROBE_TIMEOUT` seconds. A failed probe (a refused or
cut connection) opens the breaker; an unanswered one is asked again at once, and a second
unanswered probe opens it (one late answer is more often this process's own event loop held
up than Redis stalled). While open it probes every :data:`AWAY_INTERVAL` seconds, and the
first answer closes it, so the first request after Redis returns is served normally. The probe's
own commands pass the gate (a context variable marks them); nothing else does.

The gate sits where every command of a client is packed (:class:`GatedConnection`), so a
healthy store costs one attribute check a command.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors.failures import describe
from ..ops import metrics

log = logging.getLogger(__name__)

INTERVAL = 0.5
"""Seconds between probes while the store answers."""
AWAY_INTERVAL = 0.1
"""Seconds between probes while it does not."""
PROBE_TIMEOUT = 1.0
"""Seconds a probe waits for its answer (two unanswered in a row open the breaker)."""

_PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("store_probe", default=False)


class StoreAway(RedisConnectionError):
    """A command not sent: the store is known to be away (see :class:`StoreBreaker`)."""


class StoreBreaker:
    """Whether the store is away, as the probe last found it."""

    def __init__(self) -> None:
        self.away = False
        """True while commands fail at once."""
        self.since = 0.0
        """When it last opened (``time.monotonic()``)."""
        self.reason = ""
        self.returns = 0
        """How many times it closed again (what was known before a return may be stale)."""

    def error(self) -> StoreAway:
        return StoreAway(
            f"the store has not answered for {time.monotonic() - self.since:.0f} s "
            f"({self.reason}); failing fast until it does"
        )

    def open(self, exc: BaseException) -> None:
        if not self.away:
            self.away, self.since = True, time.monotonic()
            metrics.STORE_AWAY.set(1)
            log.error("the store is away (%s): failing requests fast", describe(exc))
        self.reason = describe(exc)

    def close(self) -> None:
        if self.away:
            self.away = False
            self.returns += 1
            metrics.STORE_AWAY.set(0)
            log.warning("the store answers again after %.1f s", time.monotonic() - self.since)

    async def watch(self, redis: Any) -> None:
        """Probe ``redis`` (the client this breaker gates) until cancelled."""
        _PROBING.set(True)  # this task's commands pass the gate
        unanswered = 0
        while True:
            try:
                await asyncio.wait_for(redis.ping(), PROBE_TIMEOUT)
            except TimeoutError:
                unanswered += 1
                if unanswered >= 2 or self.away:
                    silent = unanswered * PROBE_TIMEOUT
                    self.open(RedisTimeoutError(f"no answer to PING for {silent:g} s"))
            except (RedisError, OSError) as exc:
                self.open(exc)
            else:
                unanswered = 0
                self.close()
            await asyncio.sleep(AWAY_INTERVAL if self.away or unanswered else INTERVAL)


class GatedConnection(AbstractConnection):
    """A connection that sends nothing while its :attr:`breaker` says the store is away."""

    breaker: StoreBreaker

    def pack_command(self, *args: Any) -> Any:
        if self.breaker.away and not _PROBING.get():
            raise self.breaker.error()
        return super().pack_command(*args)


def gated(
    connection_class: type[AbstractConnection], breaker: StoreBreaker
) -> type[AbstractConnection]:
    """``connection_class`` behind ``breaker``'s gate (a class of its own for each client)."""
    name = f"Gated{connection_class.__name__}"
    return type(name, (GatedConnection, connection_class), {"breaker": breaker})


def breaker_of(redis: Any) -> StoreBreaker | None:
    """The breaker that gates client ``redis``; None for a client without one (a cluster,
    the embedded store)."""
    pool = getattr(redis, "connection_pool", None)
    kind = getattr(pool, "connection_class", None)
    found = getattr(kind, "breaker", None)
    return found if isinstance(found, StoreBreaker) else None
