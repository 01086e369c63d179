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

The gate sits where every command of a client is packed
(:class:`~broker.compat.redis.GatedConnection`), so a healthy store costs one attribute
check a command; and where a command takes its connection from the pool
(:class:`~broker.compat.redis.GatedPool`): while away, no command waits for a
connection, and those waiting when the breaker opens (for a free connection, or for one
being opened to the stalled server) are released at once with its error
(:meth:`StoreBreaker.unless_away`). Without that, a stall under load (10 clients, 200
requests a second) left requests queued behind the pool for up to its 20 s timeout long
after the breaker had opened.

**A Redis Cluster** has one breaker for the whole cluster, away when *no* master answers:
the probe pings every master the client knows at once, and a round is answered by the first
``PONG``. One master stalled or failing over leaves it closed (the others answer): its
commands wait for their own timeout and are tried again by the cluster client
(:mod:`.cluster`), as without a breaker. The gate is the cluster client's own
(:class:`~broker.compat.redis.GatedCluster`: commands, pipelines, reloads of the slot map)
and that of every connection to every node.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors.failures import describe
from ..ops import metrics
from .errors import StoreAway as StoreAway  # where the gates and tests find it

log = logging.getLogger(__name__)
T = TypeVar("T")

INTERVAL = 0.5
"""Seconds between probes while the store answers."""
AWAY_INTERVAL = 0.1
"""Seconds between probes while it does not."""
PROBE_TIMEOUT = 1.0
"""Seconds a probe waits for its answer (two unanswered in a row open the breaker)."""

_PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("store_probe", default=False)


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
        self._waiting: set[asyncio.Task[Any]] = set()
        """Tasks waiting for a connection (:meth:`unless_away`)."""
        self._cut: set[asyncio.Task[Any]] = set()
        """Those of them the breaker's opening cancelled."""
        self._on_open: list[Callable[[], None]] = []

    def check(self) -> None:
        """Raise :class:`StoreAway` while away, but for the probe's own commands (what a
        gate asks: :class:`~broker.compat.redis.Gate`)."""
        if self.away and not _PROBING.get():
            raise self.error()

    def error(self) -> StoreAway:
        return StoreAway(
            f"the store has not answered for {time.monotonic() - self.since:.0f} s "
            f"({self.reason}); failing fast until it does"
        )

    def open(self, exc: BaseException) -> None:
        self.reason = describe(exc)
        if not self.away:
            self.away, self.since = True, time.monotonic()
            metrics.STORE_AWAY.set(1)
            log.error("the store is away (%s): failing requests fast", self.reason)
            for task in self._waiting - self._cut:  # released: see unless_away
                self._cut.add(task)
                task.cancel()
            for cut in list(self._on_open):
                cut()

    def on_open(self, cut: Callable[[], None]) -> None:
        """Call ``cut`` whenever the breaker opens (a pool's connections, cut so that the
        calls waiting on them fail now)."""
        self._on_open.append(cut)

    def off_open(self, cut: Callable[[], None]) -> None:
        if cut in self._on_open:
            self._on_open.remove(cut)

    async def unless_away(self, waiting: Awaitable[T]) -> T:
        """``waiting`` (a command's wait for a connection) awaited, unless the breaker
        opens meanwhile: then it is cancelled and :class:`StoreAway` raised at once, as
        for a command sent while away. The probe's own waits are left alone."""
        task = asyncio.current_task()
        if task is None or _PROBING.get():
            return await waiting
        self._waiting.add(task)
        try:
            return await waiting
        except asyncio.CancelledError:
            if task not in self._cut or task.uncancel() > 0:
                raise  # cancelled by its owner (too): theirs to handle
            raise self.error() from None
        finally:
            self._waiting.discard(task)
            self._cut.discard(task)

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
        in_flight: dict[str, asyncio.Future[Any]] = {}
        while True:
            try:
                await asyncio.wait_for(_ping(redis, in_flight), PROBE_TIMEOUT)
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


def breaker_of(redis: Any) -> StoreBreaker | None:
    """The breaker that gates client ``redis``; None for a client without one (the
    embedded store)."""
    found = getattr(redis, "gate", None)  # a cluster client's (GatedCluster)
    if found is None:
        pool = getattr(redis, "connection_pool", None)
        found = getattr(getattr(pool, "connection_class", None), "gate", None)
    return found if isinstance(found, StoreBreaker) else None


async def _ping(redis: Any, in_flight: dict[str, asyncio.Future[Any]]) -> None:
    if isinstance(redis, RedisCluster):
        await _any_master(redis, in_flight)
    else:
        await redis.ping()


async def _any_master(cluster: RedisCluster, in_flight: dict[str, asyncio.Future[Any]]) -> None:
    """``PING`` every master ``cluster`` knows, at once, on each one's own connections (not
    through the client, which would take a silent master for failed and reload its slot
    map); return at the first answer. When every one failed, raise a ``ConnectionError``
    saying so; while any is silent, wait (the caller's timeout ends it).

    The pings not answered first are left to finish (``in_flight``, by node, between
    rounds; a node whose ping of an earlier round is still out is not pinged again, its
    ping is waited for): a ping cancelled in flight costs its connection, and cancelling
    two every round made an idle role open two connections a second."""
    masters = cluster.get_primaries()
    if not masters:  # never initialized: nothing known yet
        try:
            await cluster.initialize()
        except RedisClusterException as exc:
            raise RedisConnectionError(describe(exc)) from exc
        masters = cluster.get_primaries()
    if not masters:
        raise RedisConnectionError("the cluster client knows no master")
    for name in [name for name, ping in in_flight.items() if ping.done()]:
        del in_flight[name]
    for node in masters:
        if node.name not in in_flight:
            sent = asyncio.ensure_future(node.execute_command("PING"))
            sent.add_done_callback(_retrieved)  # those still running when one answers
            in_flight[node.name] = sent
    pings = {in_flight[node.name] for node in masters}
    failure: BaseException = RedisConnectionError("no answer")
    try:
        while pings:
            done, pings = await asyncio.wait(pings, return_when=asyncio.FIRST_COMPLETED)
            for ping in done:
                if ping.exception() is None:
                    return
                failure = ping.exception() or failure
        raise RedisConnectionError(f"no master answered PING ({describe(failure)})")
    except asyncio.CancelledError:
        for ping in pings:  # no answer in time (or stopping): a stalled master's, cut
            ping.cancel()
        raise


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # not "never retrieved": a failure of one master says little
