"""A front's cache of list pages, kept fresh by the index's announcements.

A page of ``session/list`` (or of ``GET /v1/sessions`` and the MCP ``session_list``) is
a function of the tenant's index, and the index changes only where a writer announces it
(:data:`~broker.store.keys.INDEX_CHANNEL`, see :class:`~broker.store.index.SessionIndex`).
So a front answers a page it answered before from memory, without the Redis round trip,
until the tenant's next announcement arrives; then every page of that tenant is dropped.

Correctness rests on three rules:

* **Generations.** A read takes a token (:meth:`PageCache.begin`) before it goes to Redis;
  its page is stored only if no announcement of its tenant (and no reset) came after the
  token was taken. A read in flight across an invalidation is answered, not stored.
* **No subscription, no cache.** Pages are served and stored only while the watch
  (:class:`IndexWatch`) is subscribed to the channel and hears its own probes. Start-up, a
  lost connection, a Redis restart (with or without its data), a failover, a stall (a probe
  not heard within :data:`PROBE_INTERVAL`) all bypass the cache; every (re)subscription
  starts it empty, since what was announced meanwhile is unknown.
* **Through an outage** (:class:`HeldPages`), the pages kept when the watch lost its
  subscription are still answered while the store is known to be away (its breaker is
  open), and only then: never once the store has answered again (the next subscription
  drops them), nor in an outage that began well after they stopped being kept. Writes made
  through other fronts during the outage are not in them; no write goes through this one.
* **The front's own writes** (``session/new``, ``set_title``, ``delete`` …) are dropped
  locally at once, before their reply (``SessionIndex.changed``), and announced to the
  other fronts like the projector's.

**Refreshed, not only dropped.** A page is read again in the background when its tenant's
announcement drops it, up to :data:`REFRESH_BUDGET` times between two asks of it (at most
:data:`REFRESH_PAGES` of a tenant, the most recently asked; one refresh of a tenant at a
time: announcements that arrive meanwhile are coalesced into one more), so the next ask (a
window polling the first page while the tenant's sessions change now and then) is a hit
rather than a read; a page whose tenant changes far more often than it is asked for is
dropped only, once its budget is spent. A refreshed page is an ordinary read: taken after
the announcement, kept only under the rules above, so it is never older than a page a miss
would have read then.

**Read ahead.** A client paging through a list asks for the next page as soon as it has
one. So when a page is read from Redis for a client, the page after it is read in the
background (:meth:`PageCache.read_ahead`, at most :data:`READS_AHEAD` at once), under the
same rules as any read. When a client first asks for a page read ahead, the page after that
one is read ahead in turn. A client that asks for a page while it is being read ahead waits for
that read (:meth:`PageCache.landed`) rather than making its own. A list read page by page
thus costs one round trip for its first page, and each later page is a hit, or waits for
what is left of its read.

**Heard by clients too.** The watch hands each announced tenant, after the cache, to a
listener (:class:`~.list_changes.ListChanges`: the connections told that their list
changed), and every (re)subscription to it; it runs without a cache too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors.failures import FailureLog
from ..lifetimes import RoleLoops
from ..loops import cancel_and_wait
from ..ops import metrics
from ..store.breaker import StoreBreaker, breaker_of
from ..store.client import Store
from ..store.keys import INDEX_CHANNEL
from ..store.live import LiveFeed, Message, Publisher, open_live_feed

log = logging.getLogger(__name__)

PROBE_INTERVAL = 1.0
"""Seconds between two probes of the channel; one not heard by the next is a deaf
subscription (a stall, a failover): the cache is bypassed until it is subscribed again."""
RETRY_PAUSE = 0.5
"""Seconds between two attempts to subscribe while Redis is away."""
PROBE_MARK = "!"
"""Probes start with it; tenant names cannot (``names.TENANT_RULE``)."""

_STAMPS_KEPT = 16_384
"""Tenants whose last change a cache remembers (a bound, see :meth:`PageCache.invalidate`)."""

Key = tuple[Hashable, ...]
"""A cached page's key: the tenant first, then everything else that shapes the answer."""

REFRESH_BUDGET = 2
"""The most times a page is read again between two asks of it."""
REFRESH_PAGES = 16
"""The most pages of one tenant read again on one announcement (the most recently asked)."""
REFRESH_TENANTS = 64
"""The most tenants whose pages are being read again at once (beyond: dropped only)."""
READS_AHEAD = 8
"""The most pages being read ahead at once (beyond: not read ahead)."""

Reload = Callable[[], Awaitable[Any]]
"""Reads a kept page again (what a miss of its key reads)."""
ReadAhead = Callable[[], Awaitable[tuple[Any, Callable[[], None] | None]]]
"""Reads a page ahead: the page, and what to do when it is first asked for (None: nothing)."""


@dataclass(slots=True)
class _Refreshable:
    """How a kept page is read again, when it was last asked for, and how many more times
    it may be read again before it is asked for again."""

    read: Reload
    asked: float
    left: int = REFRESH_BUDGET


_HIT = metrics.PAGE_CACHE.labels("hit")
_MISS = metrics.PAGE_CACHE.labels("miss")
_BYPASS = metrics.PAGE_CACHE.labels("bypass")


class PageCache:
    """A bounded LRU of pages, by tenant, with per-tenant generations."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.live = False
        """Whether the watch is subscribed: only then are pages stored (and served, but for
        :attr:`held` ones)."""
        self.held = HeldPages()
        self._entries: OrderedDict[Key, Any] = OrderedDict()
        self._by_tenant: dict[Hashable, set[Key]] = {}
        self._stamp = 0
        self._reset_at = 0
        self._changed_at: dict[Hashable, int] = {}
        self.refreshing = False
        """Whether dropped pages that were asked for lately are read again (a front's)."""
        self._reloads: dict[Key, _Refreshable] = {}
        self._refreshes: dict[Hashable, dict[Key, _Refreshable]] = {}  # pages owed a read
        self._reading: dict[Hashable, dict[Key, _Refreshable]] = {}  # being read
        self._refreshers: set[asyncio.Task[None]] = set()
        self.refresh_failures = FailureLog(log, "page refreshes")
        self._ahead: dict[Key, asyncio.Task[None]] = {}  # pages being read ahead
        self._when_asked: dict[Key, Callable[[], None]] = {}  # of pages read ahead, kept
        # The loop it serves, held from :meth:`up` on (pages are kept only after it): on
        # Python 3.11 each lookup of the running loop is a getpid() system call.
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def serving(self) -> bool:
        """Whether kept pages are answered: while the watch is subscribed, or while the pages
        it held when it lost it may be answered (see :class:`HeldPages`)."""
        return self.live or (bool(self._entries) and self.held.answerable())

    def get(self, key: Key) -> Any | None:
        """The page stored under ``key`` (the most recently used from now), or None."""
        if not self.serving:
            _BYPASS.inc()
            return None
        page = self.hit(key)
        if page is None:
            _MISS.inc()
        return page

    def hit(self, key: Key) -> Any | None:
        """:meth:`get` for a caller that falls back on it: a hit is counted, a miss or a
        bypass is not (the fallback counts it)."""
        page = self._entries.get(key) if self.serving else None
        if page is not None:
            self._entries.move_to_end(key)
            _HIT.inc()
            again = self._reloads.get(key)
            if again is not None:
                again.asked, again.left = time.monotonic(), REFRESH_BUDGET
            if self._when_asked:
                asked = self._when_asked.pop(key, None)
                if asked is not None:  # once this ask is answered: no part of its wait
                    self.soon(asked)
        return page

    def missed(self) -> None:
        """Count what :meth:`get` would have counted for a page :meth:`hit` did not find."""
        (_MISS if self.serving else _BYPASS).inc()

    def begin(self) -> int | None:
        """A token for a read about to start (None while the cache is bypassed)."""
        return self._stamp if self.live else None

    def soon(self, callback: Callable[..., None], *args: Any) -> None:
        """Have ``callback(*args)`` run once the work of this step of the event loop is done
        (a read ahead started after the reply that asked for it is written)."""
        if self._loop is not None:
            self._loop.call_soon(callback, *args)

    def read_ahead(self, key: Key, read: ReadAhead) -> None:
        """Read the page under ``key`` in the background and keep it (as :meth:`put` keeps a
        page: not if its tenant changes meanwhile), unless it is kept already, being read
        ahead, or :data:`READS_AHEAD` pages are. What ``read`` gives to do when the page is
        first asked for is done then (in :meth:`hit`). A failed read is logged, and the page
        is read when it is asked for."""
        loop = self._loop
        if not self.live or loop is None or key in self._entries or key in self._ahead:
            return
        if len(self._ahead) >= READS_AHEAD:
            return
        task = loop.create_task(self._reading_ahead(key, self.begin(), read))
        self._ahead[key] = task
        task.add_done_callback(lambda _: self._ahead.pop(key, None))

    def reading_ahead(self, key: Key) -> bool:
        """Whether the page under ``key`` is being read ahead."""
        return key in self._ahead

    def landed(self, key: Key, within: float) -> asyncio.Future[None] | None:
        """A future done once the page under ``key``, being read ahead, has landed (kept or
        not), or ``within`` seconds have passed, whichever comes first; None when it is not
        being read ahead. Cancelling the future leaves the read alone: an ask that waits for
        it is not the only one that may."""
        reading, loop = self._ahead.get(key), self._loop
        if reading is None or loop is None:
            return None
        landed: asyncio.Future[None] = loop.create_future()

        def done(_: object = None) -> None:
            if not landed.done():
                landed.set_result(None)

        reading.add_done_callback(done)
        timer = loop.call_later(within, done)

        def settled(_: object) -> None:
            timer.cancel()
            reading.remove_done_callback(done)

        landed.add_done_callback(settled)
        return landed

    async def _reading_ahead(self, key: Key, token: int | None, read: ReadAhead) -> None:
        try:
            page, asked = await read()
        except Exception as exc:  # logged: nothing waits for this read, a miss reads it again
            self.refresh_failures.failed(exc)
            return
        self.put(key, token, page)
        if asked is not None and self._entries.get(key) is page:  # kept (not a newer read)
            self._when_asked[key] = asked

    def put(self, key: Key, token: int | None, page: Any, reload: Reload | None = None) -> None:
        """Store ``page`` unless its tenant changed (or the cache was reset) since ``token``;
        ``reload`` reads it again (see :meth:`invalidate`), this ask counting as its last."""
        tenant = key[0]
        if (
            token is None
            or not self.live
            or token < self._reset_at
            or self._changed_at.get(tenant, 0) > token
        ):
            return
        if key not in self._entries:
            self._by_tenant.setdefault(tenant, set()).add(key)
        self._entries[key] = page
        self._entries.move_to_end(key)
        if reload is not None and self.refreshing:
            self._reloads[key] = _Refreshable(reload, time.monotonic())
        while len(self._entries) > self.max_entries:
            old, _ = self._entries.popitem(last=False)
            self._forget(old)

    def invalidate(self, tenant: Hashable) -> None:
        """Drop every page of ``tenant``; reads of it in flight will not be stored."""
        metrics.PAGE_CACHE_INVALIDATIONS.inc()
        self._stamp += 1
        if len(self._changed_at) >= _STAMPS_KEPT:
            # A tenant's stamp matters only to reads in flight: forget them all, and with
            # them the right of every read in flight to be kept (the pages kept stay).
            self._changed_at.clear()
            self._reset_at = self._stamp
        self._changed_at[tenant] = self._stamp
        keys = self._by_tenant.pop(tenant, ())
        owed: dict[Key, _Refreshable] = {}
        for key in keys:
            self._entries.pop(key, None)
            self._when_asked.pop(key, None)
            again = self._reloads.pop(key, None)
            if again is not None and again.left > 0:
                again.left -= 1
                owed[key] = again
        if owed or tenant in self._refreshes:  # under way: what it reads is owed again
            self._refresh(tenant, owed)

    def _refresh(self, tenant: Hashable, owed: dict[Key, _Refreshable]) -> None:
        """Read ``owed`` again in the background: the most recently asked first, a bounded
        number; joined to the tenant's refresh under way if there is one."""
        pending = self._refreshes.get(tenant)
        if pending is None and len(self._refreshes) >= REFRESH_TENANTS:
            return
        chosen = sorted(owed.items(), key=lambda item: item[1].asked, reverse=True)
        if pending is not None:
            # What is being read crossed this announcement: it will not be kept, so it is
            # owed again.
            pending.update(self._reading.get(tenant, {}))
            pending.update(chosen[: max(0, REFRESH_PAGES - len(pending))])
            return
        self._refreshes[tenant] = dict(chosen[:REFRESH_PAGES])
        task = asyncio.get_running_loop().create_task(self._refreshing(tenant))
        self._refreshers.add(task)
        task.add_done_callback(self._refreshers.discard)

    async def _refreshing(self, tenant: Hashable) -> None:
        """Read the tenant's owed pages, again while announcements owe more meanwhile (the
        reads that crossed one are not kept: generations, as any read's)."""
        try:
            while self._refreshes.get(tenant):
                owed, self._refreshes[tenant] = self._refreshes[tenant], {}
                self._reading[tenant] = owed
                token = self.begin()
                if token is None:  # bypassed: nothing would be kept
                    return
                pages = await asyncio.gather(
                    *(again.read() for again in owed.values()), return_exceptions=True
                )
                for (key, again), page in zip(owed.items(), pages, strict=True):
                    if isinstance(page, BaseException):
                        if isinstance(page, asyncio.CancelledError):
                            raise page
                        self.refresh_failures.failed(page)  # the page stays dropped
                        continue
                    self.put(key, token, page)
                    if key in self._entries:
                        self._reloads[key] = again  # refreshed is not asked: budget spent
        finally:
            self._refreshes.pop(tenant, None)
            self._reading.pop(tenant, None)

    async def stop_refreshing(self) -> None:
        """Cancel the refreshes and reads ahead under way (and wait for them to end)."""
        await cancel_and_wait(*self._refreshers, *self._ahead.values())

    def reset(self) -> None:
        """Drop every page; no read in flight will be stored."""
        self._stamp += 1
        self._reset_at = self._stamp
        self._entries.clear()
        self._by_tenant.clear()
        self._changed_at.clear()
        self._reloads.clear()
        self._when_asked.clear()

    def up(self) -> None:
        """The watch is (again) subscribed: serve and store pages, from empty."""
        self._loop = asyncio.get_running_loop()
        self.reset()
        if not self.live:
            metrics.PAGE_CACHE_LIVE.set(1)
        self.live = True

    def down(self) -> None:
        """The watch is not subscribed: store nothing, and bypass the cache but for the pages
        it holds (kept, answered only as :class:`HeldPages` allows; dropped by :meth:`up`)."""
        if self.live:
            metrics.PAGE_CACHE_LIVE.set(0)
            metrics.PAGE_CACHE_RESETS.inc()
            self.held.hold()
        self.live = False
        self._reloads.clear()  # nothing is stored until up(): nothing to read again
        self._when_asked.clear()

    def _forget(self, key: Key) -> None:
        self._reloads.pop(key, None)
        self._when_asked.pop(key, None)
        keys = self._by_tenant.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_tenant[key[0]]


HOLD_GAP = 5.0
"""Seconds after the watch lost its subscription within which the store's breaker must open
for the pages held then to be answered (a stall is noticed by the watch first, by the
breaker about a second later)."""


class HeldPages:
    """Whether the pages a cache held when its watch lost its subscription may be answered:
    while the store is known to be away (its :attr:`breaker` is open), if that outage began
    within :data:`HOLD_GAP` seconds of the loss (or before it) and the store has not answered
    since (a page kept before an answer may have missed a write announced after it)."""

    def __init__(self) -> None:
        self.breaker: StoreBreaker | None = None
        """The store's breaker (None: held pages are never answered)."""
        self._at = 0.0
        self._returns = -1

    def hold(self) -> None:
        """The watch lost its subscription now: the pages kept are held from now."""
        breaker = self.breaker
        self._at = time.monotonic()
        self._returns = breaker.returns if breaker is not None else -1

    def answerable(self) -> bool:
        breaker = self.breaker
        return (
            breaker is not None
            and breaker.away
            and breaker.returns == self._returns
            and breaker.since <= self._at + HOLD_GAP
        )


class IndexListener(Protocol):
    """What else hears the index's announcements (:class:`~.list_changes.ListChanges`)."""

    def changed(self, tenant: str) -> None:
        """``tenant``'s index changed (after the cache dropped its pages)."""
        ...

    def resubscribed(self) -> None:
        """The watch is subscribed (again): what was announced before is unknown."""
        ...


class IndexWatch:
    """Keeps a :class:`PageCache` (None: no cache) and a listener subscribed to the index's
    announcements."""

    def __init__(
        self,
        redis: Store,
        cache: PageCache | None,
        *,
        probe_interval: float = PROBE_INTERVAL,
        listener: IndexListener | None = None,
    ) -> None:
        self.redis = redis
        self.publisher = Publisher(redis)
        self.cache = cache
        if cache is not None:
            cache.held.breaker = breaker_of(redis)
        self.listener = listener
        self.live = False
        """Whether the subscription is confirmed and hears its probes."""
        self.probe_interval = probe_interval
        self._probe = f"{PROBE_MARK}{secrets.token_hex(8)}:"
        self._sent = 0
        self._heard = 0
        self._channel: LiveFeed | None = None  # the reader's subscription, while it holds one
        self.failures = FailureLog(log, "index announcements")
        self.role_loops = RoleLoops("index watch")
        """The subscription's reader and its prober, once started."""
        self.role_loops.add("page-cache-reader", self._read_loop)
        self.role_loops.add("page-cache-probe", self._probe_loop)

    async def start(self) -> None:
        await self.role_loops.start()

    def loops(self) -> list[asyncio.Task[None]]:
        return self.role_loops.tasks()

    async def stop(self) -> None:
        await self.role_loops.stop()
        self._down()
        if self.cache is not None:
            await self.cache.stop_refreshing()

    async def _read_loop(self) -> None:
        """Subscribe, hand what arrives to the cache; on any failure bypass it and start
        over (a loop of :attr:`role_loops`, started over by :meth:`_restart`)."""
        while True:
            channel = open_live_feed(self.redis)
            try:
                self._channel = channel
                await channel.ssubscribe(INDEX_CHANNEL)
                while True:
                    messages = await channel.read_batch()
                    for message in messages:
                        self._on_message(message)
                    if not messages:
                        # An engine may answer nothing without waiting: let the loop run
                        # (and a cancellation land) before asking again.
                        await asyncio.sleep(0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of the subscription: bypass, start over
                if _cancelling():  # redis-py can turn a cancellation into another error
                    raise asyncio.CancelledError from None
                self.failures.failed(exc)
            finally:
                self._down()
                if self._channel is channel:
                    self._channel = None
                with contextlib.suppress(Exception):  # closing a broken subscription
                    await channel.aclose()
            await asyncio.sleep(RETRY_PAUSE)

    def _on_message(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "pong":  # a probe's answer on the subscription's own connection
            self._heard_probe(message.get("data"))
            return
        if message.get("channel") != INDEX_CHANNEL:
            return
        if kind == "smessage":
            data = message.get("data")
            if not isinstance(data, str):
                return
            if data.startswith(PROBE_MARK):  # ours where there are no pings; other fronts'
                self._heard_probe(data)
                return
            if self.cache is not None:
                self.cache.invalidate(data)
            if self.listener is not None:
                self.listener.changed(data)
        elif kind == "ssubscribe":
            # Every confirmation, the first and those after a reconnection the client made
            # by itself (redis-py's subscribes again silently): what was announced in
            # between is unknown, so the cache starts empty.
            self._heard = self._sent
            self.failures.succeeded()
            self._up()
        elif kind == "sunsubscribe":  # the slot moved (a failover, a resharding)
            self._restart("the channel's slot moved")

    def _heard_probe(self, data: Any) -> None:
        if isinstance(data, str) and data.startswith(self._probe):
            with contextlib.suppress(ValueError):  # not a count of ours: not one of our probes
                self._heard = max(self._heard, int(data[len(self._probe) :]))

    async def _probe_loop(self) -> None:
        """Probe the subscription every :attr:`probe_interval`; a probe not heard by the
        next is a deaf subscription: bypass the cache and subscribe again.

        The probe is a ``PING`` on the subscription's own connection, whose pong comes
        back after every announcement pushed to it before: it reaches this front alone. An
        engine that cannot ping (the embedded store's) publishes it on the channel
        instead, where every front's subscription hears it (N fronts doing so: N² messages
        a second)."""
        while True:
            await asyncio.sleep(self.probe_interval)
            if self.live and self._heard < self._sent:
                self._restart(f"a probe went unheard for {self.probe_interval:g} s")
            channel = self._channel
            if channel is None:  # subscribing (again): the subscription made is probed
                continue
            self._sent += 1
            probe = f"{self._probe}{self._sent}"
            try:
                if not await channel.ping(probe):
                    await self.publisher.publish(INDEX_CHANNEL, probe)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away or stalled: bypass, subscribe afresh
                if _cancelling():
                    raise asyncio.CancelledError from None
                self.failures.failed(exc)
                if self.live:
                    self._restart(f"a probe could not be sent ({exc})")

    def _up(self) -> None:
        self.live = True
        if self.cache is not None:
            self.cache.up()
        if self.listener is not None:
            self.listener.resubscribed()

    def _down(self) -> None:
        self.live = False
        if self.cache is not None:
            self.cache.down()

    def _restart(self, why: str) -> None:
        self._down()
        self._channel = None  # closing under the reader's cancellation: not to be pinged
        log.warning("page cache bypassed: %s; subscribing again", why)
        self.role_loops.restart("page-cache-reader")


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
