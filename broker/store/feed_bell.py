"""The change feeds' bells, on a Redis Cluster: a projector waits for them, not polling.

On one server a projector blocks in one ``XREADGROUP`` of every change feed, which costs
nothing while nothing happens. On a cluster the feeds live in 256 slots, which one command
may not span, so a projector polls them, a command each (:mod:`.groups`): polling every
0.05 s would cost an idle cluster thousands of commands a second. So there:

* whoever appends to a feed rings its bell afterwards, an ``SPUBLISH`` on the feed's own
  shard channel (:func:`~.keys.feed_bell`), at most once every :data:`RING_EVERY` seconds a
  feed (:class:`FeedBells`): an appender rings a busy feed once a second, an idle one not at
  all;
* a projector whose polls found nothing for :data:`AWAKE` seconds (longer than
  :data:`RING_EVERY`, so that what an appender appended without ringing, within a second of
  a ring, is found by a poll) waits for a bell, and polls anyway every :data:`SAFETY`
  seconds, for a bell lost while its subscription moves (:class:`Doorbell`); before that it
  polls with pauses that double from its poll interval up to :data:`MOST_PAUSE`, cut short
  by a bell;
* a poll reads only the feeds that are *hot*: whose bell rang, or where entries were
  found, within the last :data:`AWAKE` seconds (an append within a second of its feed's
  bell finds the feed hot), and every feed now and then (every :data:`SAFETY` seconds, at
  first, and whenever the bells may have gone unheard): a busy projector of 20 sessions
  polls their feeds, not 256.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence

from ..errors.failures import FailureLog
from ..loops import cancel_and_wait
from .client import Store, commands
from .keys import feed_bell
from .live import open_live_feed

log = logging.getLogger(__name__)

RING_EVERY = 1.0
"""Seconds an appender lets pass before it rings a feed's bell again."""
AWAKE = 2.5
"""Seconds of empty polls after the last entry found or bell heard before a reader waits
for bells (past :data:`RING_EVERY`, with room for a ring's own round trip)."""
MOST_PAUSE = 1.0
"""The longest pause between two polls while awake, or while the bells cannot be heard."""
SAFETY = 15.0
"""The longest a reader waiting for bells goes without polling, and a busy one without
polling every feed (not only the hot ones)."""
LISTEN_PAUSE = 1.0
"""Seconds between two attempts to subscribe to the bells."""


class FeedBells:
    """An appender's side: ring a feed's bell after appending to it, at most once every
    :data:`RING_EVERY` seconds a feed."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)
        self._rung: dict[str, float] = {}

    async def ring(self, feeds: Iterable[str]) -> None:
        """Ring the bells of ``feeds`` (appended to just now) not rung within the last
        :data:`RING_EVERY` seconds. A ring that fails is only logged (what was appended is
        in; the feed's reader finds it by its next poll, within :data:`SAFETY` seconds),
        and the next append rings again."""
        now = asyncio.get_running_loop().time()
        due = [
            f for f in dict.fromkeys(feeds) if now - self._rung.get(f, -RING_EVERY) >= RING_EVERY
        ]
        if not due:
            return
        for feed in due:
            self._rung[feed] = now
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for feed in due:
                    pipe.spublish(feed_bell(feed), "1")
                await pipe.execute()
        except Exception as exc:  # a hint, not data: the append stands, and the projector's
            # check of every feed (at most SAFETY seconds away) finds its notice
            for feed in due:
                self._rung.pop(feed, None)
            log.debug("could not ring the bells of %d change feeds: %r", len(due), exc)


class Doorbell:
    """A reader's side: the bells of ``feeds``, heard on the store's live feed by a task of
    its own (:meth:`start`); :meth:`wait` returns when one rings."""

    def __init__(self, redis: Store, feeds: Sequence[str]) -> None:
        self.redis = commands(redis)
        self._feeds = {feed_bell(feed): feed for feed in feeds}
        self.channels = list(self._feeds)
        self._rung: set[str] = set()
        self._everything = True
        self.listening = False
        """Whether the bells are heard now (subscribed, and the subscription has not
        failed since)."""
        self._rang = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures = FailureLog(log, "listening to the change feeds' bells (polling)")

    def start(self) -> None:
        """Start listening (again, if the listener ended), in the running loop."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name="feed-bells")

    def take(self) -> set[str] | None:
        """The feeds whose bells rang since the last call; None when any may have rung
        unheard meanwhile (at first, and after every new subscription): poll them all."""
        rung, self._rung = self._rung, set()
        if self._everything or not self.listening:
            self._everything = False
            return None
        return rung

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a bell (or for the bells to go unheard: what
        rang meanwhile is unknown); whether one came."""
        if not self._rang.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._rang.wait()
        rang = self._rang.is_set()
        self._rang.clear()
        return rang

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        self.listening = False

    async def _listen(self) -> None:
        while True:
            feed = open_live_feed(self.redis)
            try:
                await feed.ssubscribe(*self.channels)
                self.listening = True
                self._failures.succeeded()
                while True:
                    for message in await feed.read_batch():
                        kind = message.get("type")
                        if kind == "smessage":
                            self._rung.add(self._feeds.get(str(message.get("channel")), ""))
                            self._rang.set()
                        elif kind in ("ssubscribe", "sunsubscribe"):
                            self._everything = True  # bells perhaps missed meanwhile
                            self._rang.set()
                        if kind == "sunsubscribe" and message.get("channel"):
                            # its slot left the node: subscribed again where it is now
                            await feed.ssubscribe(message["channel"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the reader polls meanwhile
                self._failures.failed(exc)
            finally:
                self.listening = False
                self._everything = True
                self._rang.set()
                with contextlib.suppress(Exception):  # a dead feed's close: nothing to lose
                    await feed.aclose()
            await asyncio.sleep(LISTEN_PAUSE)
