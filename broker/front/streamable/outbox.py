"""The outbox of a Streamable HTTP connection: what it sends goes to the store, in order.

The connection's parts (intake, active sessions) send frames through an outbox as they do
on a WebSocket; this one writes no socket. It routes each message to its scope
(:mod:`.scopes`), gathers what is sent in one step of the event loop, and appends it to the
scopes' streams in the store in one fenced call (:meth:`~broker.store.http_links.HttpLinks.emit`),
one call at a time, so the streams hold the messages in the order they were sent. The GET
streams (on any front) read them from there. A response the caller waits for itself
(``initialize``'s, answered in the POST's body) is handed to it instead.

A store that does not keep up lets the unwritten bytes grow to ``max_queue_bytes``; past
that the connection is let go here, as a WebSocket whose client does not read is cut.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from ... import fastjson
from ...ops import metrics
from ...store.http_links import HttpLinks
from ..acp.lifetime import Lifetime
from ..acp.outbox import Outbox, Wire

log = logging.getLogger(__name__)

EVENT_SCOPES_KEPT = 4096
"""Event frames whose scope is remembered (their texts are shared: see send_event)."""
_EVENT_SCOPES: dict[str, str] = {}

BATCH = 256
"""Messages appended in one store call at most (a script's arguments are bounded)."""


class Sink(Protocol):
    """What an :class:`HttpOutbox` writes for (its connection)."""

    def route(self, message: Any) -> str | None:
        """The scope of a message; None when it is taken by a waiting caller instead."""
        ...

    def fields(self) -> dict[str, str]:
        """The record's fields to set with what is appended now (what a takeover reads)."""
        ...

    def stored(self, written: list[tuple[str, str]], cursors: list[tuple[int, str]]) -> None:
        """``written`` (scope, text) messages are in the store, at ``cursors`` (cursor,
        reader) each."""
        ...

    def lost(self, reason: str) -> None:
        """The connection cannot send any more from here: let it go."""
        ...


class HttpOutbox(Outbox):
    """An :class:`~broker.front.acp.outbox.Outbox` whose frames go to the store's streams,
    through the node's :class:`Emitter`."""

    __slots__ = ("_pending", "emitter", "sink", "waiting")

    def __init__(
        self,
        sink: Sink,
        emitter: Emitter,
        conn_id: str,
        max_queue_bytes: int,
        loop: asyncio.AbstractEventLoop,
        lifetime: Lifetime,
    ) -> None:
        super().__init__(_NO_WIRE, conn_id, max_queue_bytes, loop, lifetime)
        self.sink = sink
        self.emitter = emitter
        self._pending: list[tuple[str, str]] = []
        self.waiting = False
        """Whether the emitter has this outbox in its list."""

    def send_text(self, text: str, *, shared: bool = False, alone: bool = False) -> None:
        if self.closing:
            return
        scope = self.sink.route(fastjson.loads(text))
        if scope is not None:
            self._queue_message(scope, text)

    def _queue_message(self, scope: str, text: str) -> None:
        metrics.FRAMES_SENT.inc()
        metrics.BYTES_SENT.inc(len(text))
        self._pending.append((scope, text))
        self.queued_bytes += len(text)
        if self.queued_bytes > self.max_queue_bytes:
            self.fail("slow store: outgoing messages not written in time")
            metrics.CLOSES.labels("slow_consumer").inc()
            return
        if not self.waiting:
            self.waiting = True
            self.emitter.want(self)

    def send_event(self, text: str, alone: bool = False) -> None:
        """An event's frame: the same text for every connection of its session, so its
        scope (the session it names) is found once, not parsed again per connection."""
        if self.closing:
            return
        scope = _EVENT_SCOPES.get(text)
        if scope is None:
            scope = self.sink.route(fastjson.loads(text))
            if scope is None:
                return
            if len(_EVENT_SCOPES) >= EVENT_SCOPES_KEPT:
                _EVENT_SCOPES.clear()
            _EVENT_SCOPES[text] = scope
        self._queue_message(scope, text)

    def send_encoded(self, parts: tuple[bytes, ...]) -> None:
        self.send_text(b"".join(parts).decode())

    def send_run(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.send_text(text, shared=True)

    def send_each_now(self, frames: Iterable[str]) -> None:
        self.send_run(frames)

    def writes_directly(self) -> bool:
        return False

    def close(self) -> asyncio.Task[None] | None:
        self.closing = True
        return None

    def take(self) -> list[tuple[str, str]]:
        """The next messages to append (:data:`BATCH` at most; the rest wait their turn)."""
        batch = self._pending[:BATCH]
        del self._pending[:BATCH]
        return batch

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def stored(self, batch: list[tuple[str, str]], reply: list[tuple[int, str]] | None) -> None:
        """The emitter appended ``batch`` (``reply``: the cursors, None: not ours)."""
        self.queued_bytes -= sum(len(text) for _, text in batch)
        if reply is None:
            self.fail("the connection is run by another front now")
            return
        self.sink.stored(batch, reply)

    def fail(self, reason: str) -> None:
        """Send nothing more: the connection is let go here."""
        if not self.closing:
            self.closing = True
            self._pending = []
            self.queued_bytes = 0
            self.sink.lost(reason)


class Emitter:
    """Appends what the connections of a node send to the store, one pipeline at a time: what
    they all send in one step of the event loop (an event fanned out to many) goes in one
    round trip (:meth:`~broker.store.http_links.HttpLinks.emit_many`), and one pipeline
    after another keeps every connection's messages in the order they were sent."""

    def __init__(self, links: HttpLinks, node: str) -> None:
        self.links = links
        self.node = node
        self._ready: list[HttpOutbox] = []
        self._running: asyncio.Task[None] | None = None

    def want(self, outbox: HttpOutbox) -> None:
        """``outbox`` has messages to append."""
        self._ready.append(outbox)
        if self._running is None:
            self._running = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            await asyncio.sleep(0)  # what this step of the event loop sends goes together
            while self._ready:
                ready, self._ready = self._ready, []
                batches = [(outbox, outbox.take()) for outbox in ready if not outbox.closing]
                calls = [
                    (outbox.conn_id, self.node, batch, outbox.sink.fields())
                    for outbox, batch in batches
                ]
                try:
                    replies = await self.links.emit_many(calls)
                except Exception as exc:  # each connection is let go, visibly
                    log.warning("could not store %d connections' messages: %s", len(calls), exc)
                    for outbox, _ in batches:
                        outbox.fail("its messages could not be stored")
                    continue
                for (outbox, batch), reply in zip(batches, replies, strict=True):
                    outbox.stored(batch, reply)
                    if outbox.has_pending and not outbox.closing:
                        self._ready.append(outbox)
                    else:
                        outbox.waiting = False
        finally:
            self._running = None
            for outbox in self._ready:  # cancelled (the node stops): nothing more is sent
                outbox.waiting = False
            self._ready = []


class _NoWire:
    """The socket an :class:`HttpOutbox` has none of (its parent class's writes never run)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"a Streamable HTTP connection has no socket ({name})")


_NO_WIRE: Wire = _NoWire()
