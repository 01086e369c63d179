"""The fan-out hub: one live subscription per session, shared by every local connection.

A front node subscribes (sharded pub/sub) once per session that is active on
any of its connections, reference counted, and hands each event to all of
them. Pub/sub may drop messages, so the hub keeps the last seq it delivered per
session: an older seq is a duplicate and is dropped, a gap is filled from the
log before the new event goes out, and a periodic position check against the
snapshots catches a loss that no later event reveals. Connections therefore
see every event of a session in seq order, each exactly once, from the
position :meth:`FanoutHub.join` returned.

The hub's two loops, the pub/sub reader and the position check, are the loops of a
:class:`~broker.lifetimes.RoleLoops` (restarted with backoff when one fails, readiness
naming it); a subscription found deaf is read afresh by starting its reader over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import fastjson
from ..errors.failures import FailureLog
from ..lifetimes import RoleLoops
from ..model.events import EventType
from ..ops import metrics, tracing
from ..ops.health import Unhealthy
from ..store.client import Store
from ..store.events import LogEvent
from ..store.floors import rewound
from ..store.keys import SessionKeys, node_channel
from ..store.live import LiveFeed, Message, Publisher, open_live_feed
from ..store.log import SessionLog, SessionMissing
from ..store.retry import STORE_AWAY

log = logging.getLogger(__name__)

_CHECK_SLICE = 128
"""Snapshots read per round trip by the position check."""


class HubListener(Protocol):
    """Who else hears what arrives on the hub's subscriptions."""

    def on_node_message(self, message: dict[str, Any]) -> None:
        """A message on this node's own channel (replies from agent hosts)."""

    def on_session_message(self, keys: SessionKeys, message: dict[str, Any]) -> None:
        """A message on a session's channel that is not a log event (agent requests)."""

    def on_event(self, event: LogEvent) -> None:
        """A log event, after every subscriber has been handed it."""


class Subscriber(Protocol):
    """A connection, as the hub sees it."""

    id: str

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        """Send ``event`` on; ``alone``: no other event is handed out in this step of the
        event loop (so its frame is written at once rather than gathered with others)."""
        ...


@dataclass(eq=False)
class SessionFeed:
    """This node's live subscription to one session."""

    keys: SessionKeys
    subscribers: set[Subscriber] = field(default_factory=set)
    last: int | None = None  # the last seq handed out; None until the subscription is live
    epoch: str | None = None
    early: list[tuple[int, str, LogEvent]] = field(default_factory=list)
    ready: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    confirmed: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    deaf: dict[Subscriber, frozenset[str]] = field(default_factory=dict)
    """The opt-in event types (:data:`OPT_IN`) each subscriber is known not to take."""
    deaf_counts: dict[str, int] = field(default_factory=dict)
    """How many subscribers are deaf to each opt-in event type (from :attr:`deaf`)."""
    behind: int = 0  # the snapshot's seq at the last position check, if it was ahead of us
    rewound: int = 0  # the seq delivered here that the log was last found behind (reported)
    heard: bool = False  # whether an event was handed out since the last position check


class FanoutHub:
    """Live events of the sessions active on this node's connections."""

    def __init__(
        self, redis: Store, session_log: SessionLog, *, check_interval: float = 2.0
    ) -> None:
        self.redis = redis
        self.log = session_log
        self.publisher = Publisher(redis)
        self.check_interval = check_interval
        self.node_id = secrets.token_hex(8)
        self.node_channel = node_channel(self.node_id)
        self.listener: HubListener | None = None
        self._feeds: dict[str, SessionFeed] = {}
        self._live: LiveFeed | None = None  # the subscriptions (see broker.store.live)
        self._unread = False  # whether start() opened the subscription the reader reads
        self._process_lock = asyncio.Lock()
        self._probes_unanswered = 0
        self.role_loops = RoleLoops("fan-out")
        """The pub/sub reader and the position check, once started."""
        self.role_loops.add("hub-reader", self._reading)
        self.role_loops.add("hub-position-check", self._check_loop)
        self.read_failures = FailureLog(log, "pub/sub read")
        self.check_failures = FailureLog(log, "position check")
        self.catch_up_failures = FailureLog(log, "catch-up read")
        session_log.add_floor_source(self.reached)

    async def start(self) -> None:
        """Subscribe (returning once subscribed), then start the loops."""
        await self._subscribe()
        self._unread = True
        await self.role_loops.start()

    async def _subscribe(self) -> LiveFeed:
        """Open the subscriptions: this node's channel, every live session's (a previous
        subscription is closed first: a deaf one, or one its failed reader left)."""
        if self._live is not None:
            with contextlib.suppress(Exception):  # the old subscription: replaced just below
                await self._live.aclose()
        self._live = live = open_live_feed(self.redis)
        await live.ssubscribe(self.node_channel)
        for channel in list(self._feeds):
            await live.ssubscribe(channel)
        return live

    async def _reading(self) -> None:
        """The pub/sub reader (a loop of :attr:`role_loops`): reads what :meth:`start`
        subscribed; started again (a failure, a deaf subscription), it subscribes afresh,
        and the position check fills the gap from the logs."""
        live = self._live
        if live is None or not self._unread:
            live = await self._subscribe()
            self._probes_unanswered = 0
        self._unread = False
        await self._read_loop(live)

    def _resubscribe(self) -> None:
        """The subscription went deaf: its reader starts over (see :meth:`_reading`)."""
        log.warning("pub/sub liveness probe unanswered: resubscribing")
        self._probes_unanswered = 0
        self.role_loops.restart("hub-reader")

    def loops(self) -> list[asyncio.Task[None]]:
        """The hub's loops' tasks: the pub/sub reader and the position check."""
        return self.role_loops.tasks()

    async def check_subscribed(self) -> str | None:
        """Readiness: the pub/sub reader is subscribed and hears its own probes."""
        if self._live is None or not self.role_loops.running():
            raise Unhealthy("the pub/sub reader is not subscribed")
        if self._probes_unanswered >= 2:
            raise Unhealthy(
                f"the pub/sub reader heard none of its last {self._probes_unanswered} probes"
            )
        return None

    async def stop(self) -> None:
        await self.role_loops.stop()
        if self._live is not None:
            with contextlib.suppress(Exception):  # stopping: nothing reads it any more
                await self._live.aclose()

    async def join(self, tenant: str, session_id: str, subscriber: Subscriber) -> int:
        """Subscribe ``subscriber`` to a session; it gets every event after the returned seq.

        The first to join opens the feed and the others wait for it: when the open fails,
        each of them raises its error (a request answered with it, not left unanswered);
        when the opener was cancelled (its client left, its deadline passed), the next
        opens the feed for itself."""
        keys = SessionKeys(tenant, session_id)
        while True:
            feed = self._feeds.get(keys.channel)
            if feed is None:
                feed = SessionFeed(keys)
                self._feeds[keys.channel] = feed
                await self._open_or_drop(feed)
            try:
                await asyncio.shield(feed.ready)
                break
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not feed.ready.cancelled() or (task is not None and task.cancelling()):
                    raise  # this join was cancelled, not its opener
        feed.subscribers.add(subscriber)
        metrics.SESSIONS_ACTIVE.set(len(self._feeds))
        assert feed.last is not None
        return feed.last

    async def _open_or_drop(self, feed: SessionFeed) -> None:
        """:meth:`_open`; when it fails the feed is dropped, and those waiting for it get
        its error (or, if the open was cancelled, open it again themselves)."""
        try:
            await self._open(feed)
        except BaseException as exc:
            self._feeds.pop(feed.keys.channel, None)
            _fail(feed.ready, exc)
            # Best effort: the open's own error is raised; a stray channel only costs
            # messages nobody reads, until the resubscription after a fault drops it.
            with contextlib.suppress(Exception):
                await self._subscriptions().sunsubscribe(feed.keys.channel)
            raise

    async def leave(self, tenant: str, session_id: str, subscriber: Subscriber) -> None:
        channel = SessionKeys(tenant, session_id).channel
        feed = self._feeds.get(channel)
        if feed is None:
            return
        feed.subscribers.discard(subscriber)
        _count_deaf(feed, subscriber, frozenset())
        if not feed.subscribers and feed.ready.done():
            del self._feeds[channel]
            metrics.SESSIONS_ACTIVE.set(len(self._feeds))
            # Nobody here watches it any more: a channel left subscribed only costs messages
            # nobody reads, until the resubscription after a fault drops it.
            with contextlib.suppress(Exception):
                await self._subscriptions().sunsubscribe(channel)

    def deaf_to(
        self, tenant: str, session_id: str, subscriber: Subscriber, kinds: frozenset[str]
    ) -> None:
        """``subscriber`` takes none of the opt-in event types ``kinds`` of the session (it
        would drop them): an event of a type every subscriber is deaf to is handed to none,
        rather than to each to drop (a connect storm on one session logs a presence change a
        window, which only a few follow)."""
        feed = self._feeds.get(SessionKeys(tenant, session_id).channel)
        if feed is not None and subscriber in feed.subscribers:
            _count_deaf(feed, subscriber, kinds & OPT_IN)

    def reached(self, tenant: str, session_id: str) -> int:
        """The last seq of the session handed out here (0: none): this front's appends pass
        it as their floor, so that a log Redis rewound gives none of its seqs again."""
        feed = self._feeds.get(SessionKeys(tenant, session_id).channel)
        return feed.last or 0 if feed is not None else 0

    def subscribers(self, session_id: str, tenant: str) -> list[Subscriber]:
        feed = self._feeds.get(SessionKeys(tenant, session_id).channel)
        return list(feed.subscribers) if feed else []

    def _subscriptions(self) -> LiveFeed:
        if self._live is None:
            raise RuntimeError("the fan-out hub is not started")
        return self._live

    async def _open(self, feed: SessionFeed) -> None:
        await self._subscriptions().ssubscribe(feed.keys.channel)
        await asyncio.wait_for(asyncio.shield(feed.confirmed), 10.0)
        feed.last, feed.epoch = await self.log.head(feed.keys.tenant, feed.keys.session_id)
        early, feed.early = feed.early, []
        async with self._process_lock:
            for seq, epoch, event in early:
                await self._accept(feed, seq, epoch, event)
        feed.ready.set_result(None)

    async def _read_loop(self, live: LiveFeed) -> None:
        """Read the live messages and handle them, a read's batch at a time."""
        while True:
            try:
                messages = await live.read_batch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the feed reconnects on the next read
                self.read_failures.failed(exc)
                await asyncio.sleep(0.5)
                continue
            self.read_failures.succeeded()
            if messages:
                await self._on_messages(messages)

    async def _on_messages(self, messages: list[Message]) -> None:
        """Handle what one read brought, in order, under one hold of the lock."""
        alone = len(messages) == 1
        async with self._process_lock:
            for message in messages:
                try:
                    await self._on_message(message, alone)
                except asyncio.CancelledError:
                    raise
                except STORE_AWAY as exc:
                    # A catch-up read in a Redis blip: summarized, not a traceback a message.
                    # Nothing is lost: the next gap, or the position check, reads it again.
                    self.catch_up_failures.failed(exc)
                except Exception:
                    log.exception("a pub/sub message could not be handled: %.200r", message)

    async def _on_message(self, message: Message, alone: bool = False) -> None:
        """One message (the caller holds the lock); ``alone``: the only one of its read."""
        channel = message.get("channel")
        if channel == self.node_channel:
            if message.get("type") != "smessage":
                return
            data = json.loads(message["data"])
            if "probe" in data:
                self._probes_unanswered = 0
            elif self.listener is not None:
                self.listener.on_node_message(data)
            return
        feed = self._feeds.get(channel) if isinstance(channel, str) else None
        if feed is None:
            return
        kind = message.get("type")
        if kind == "ssubscribe":
            if not feed.confirmed.done():
                feed.confirmed.set_result(None)
            return
        if kind == "sunsubscribe":
            # Not asked by us (a feed we left is gone): the channel's slot moved to another
            # node (or the client moved the subscription there). Subscribe where it is now;
            # what was published meanwhile comes from the log (the next seq's gap, or the
            # position check).
            await self._subscriptions().ssubscribe(feed.keys.channel)
            return
        if kind != "smessage":
            return
        data = fastjson.loads(message["data"])
        if "seq" not in data:
            if self.listener is not None:
                self.listener.on_session_message(feed.keys, data)
            return
        event = LogEvent(int(data["seq"]), str(data["epoch"]), int(data["ts"]), data["event"])
        if feed.last is None:
            feed.early.append((event.seq, event.epoch, event))
            return
        await self._accept(feed, event.seq, event.epoch, event, alone=alone)

    async def _accept(
        self, feed: SessionFeed, seq: int, epoch: str, event: LogEvent, *, alone: bool = False
    ) -> None:
        assert feed.last is not None
        if epoch != feed.epoch:
            log.warning(
                "session %s has a new log epoch; catching up from its start", feed.keys.session_id
            )
            feed.epoch, feed.last = epoch, 0
        if seq <= feed.last:
            return
        if seq > feed.last + 1:
            await self._catch_up(feed, until=seq - 1)
        self._hand_out(feed, event, alone=alone)

    async def _catch_up(self, feed: SessionFeed, until: int | None = None) -> None:
        assert feed.last is not None
        metrics.CATCH_UP_READS.inc()
        try:
            events = await self.log.read(
                feed.keys.tenant,
                feed.keys.session_id,
                after=feed.last,
                until=until,
                epoch=feed.epoch,
            )
        except SessionMissing:
            return
        self.catch_up_failures.succeeded()
        for event in events:
            self._hand_out(feed, event)

    def _hand_out(self, feed: SessionFeed, event: LogEvent, *, alone: bool = False) -> None:
        feed.last = event.seq
        feed.heard = True
        if feed.deaf_counts.get(event.type, 0) >= len(feed.subscribers):
            subscribers = []  # an opt-in type nobody here takes (not even copied)
        else:
            subscribers = list(feed.subscribers)
        with tracing.span("acp-broker fanout", seq=event.seq, connections=len(subscribers)):
            for subscriber in subscribers:
                subscriber.deliver(feed.keys.session_id, event, alone=alone)
        if subscribers:
            metrics.EVENTS_DELIVERED.inc(len(subscribers))
            metrics.FANOUT_LAG.observe(max(0.0, time.time() - event.ts / 1000))
        if self.listener is not None:
            self.listener.on_event(event)

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval)
            try:
                await self._probe()
                await self.check_positions()
                self.check_failures.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.check_failures.failed(exc)

    async def _probe(self) -> None:
        """Publish to ourselves: a subscription that stops hearing its own probes is dead."""
        if self._probes_unanswered >= 2:
            self._resubscribe()
        self._probes_unanswered += 1
        await self.publisher.publish(self.node_channel, '{"probe":1}')

    async def check_positions(self) -> None:
        """Compare the quiet feeds with their snapshots and fill what pub/sub lost.

        Only a feed that heard nothing since the previous check is compared: on a busy one,
        the next event reveals any gap (its seq jumps), so only a loss that no later event
        follows needs the snapshot. An event is taken for lost when it was in the snapshot
        at the previous check and has still not arrived: under load, pub/sub messages wait
        in the socket while the snapshot is already ahead, and reading the log for them
        would only do the work twice. The snapshots are read a slice at a time, so that a
        node with thousands of sessions does not stall its deliveries while it checks.
        """
        quiet = []
        for feed in self._feeds.values():
            if feed.heard:
                feed.heard, feed.behind = False, 0
            elif feed.last is not None:
                quiet.append(feed)
        for start in range(0, len(quiet), _CHECK_SLICE):
            await self._check_slice(quiet[start : start + _CHECK_SLICE])

    async def _check_slice(self, feeds: list[SessionFeed]) -> None:
        heads = await self.log.heads([(f.keys.tenant, f.keys.session_id) for f in feeds])
        async with self._process_lock:
            for feed, head in zip(feeds, heads, strict=True):
                if head is None or feed.last is None or feed.heard:
                    continue
                if int(head) < feed.last != feed.rewound and feed.epoch is not None:
                    # The log lost events handed out here (a failover lost acknowledged
                    # writes): left as the session's floor, the next event goes past them,
                    # whoever appends it (store/floors.py).
                    keys = feed.keys
                    await self.log.leave_floor(keys.tenant, keys.session_id, feed.last, feed.epoch)
                    feed.rewound = feed.last
                    rewound(keys.session_id, int(head), feed.last, found_by="fanout")
                if feed.behind > feed.last:
                    log.info("session %s: pub/sub lost events; catching up", feed.keys.session_id)
                    await self._catch_up(feed)
                feed.behind = int(head) if int(head) > feed.last else 0


def _fail(future: asyncio.Future[None], exc: BaseException) -> None:
    """End ``future`` with ``exc`` (retrieved: whoever raised it reports it), or cancel it
    when ``exc`` is a cancellation (those waiting then try for themselves)."""
    if future.done():
        return
    if isinstance(exc, Exception):
        future.set_exception(exc)
        future.exception()
    else:
        future.cancel()


OPT_IN: frozenset[str] = frozenset({EventType.INTERACTION, EventType.PRESENCE})
"""The event types a connection takes only when it asked for them."""


def _count_deaf(feed: SessionFeed, subscriber: Subscriber, kinds: frozenset[str]) -> None:
    """Record ``kinds`` as what ``subscriber`` is deaf to (replacing what it was)."""
    before = feed.deaf.pop(subscriber, frozenset())
    if kinds:
        feed.deaf[subscriber] = kinds
    counts = feed.deaf_counts
    for kind in before - kinds:
        counts[kind] -= 1
    for kind in kinds - before:
        counts[kind] = counts.get(kind, 0) + 1
