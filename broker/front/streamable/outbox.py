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
from ..acp.lifetime import Lifetime
from ..acp.outbox import Outbox, Wire

log = logging.getLogger(__name__)

EVENT_SCOPES_KEPT = 4096
"""Event frames whose scope is remembered (their texts are shared: see send_event)."""
_EVENT_SCOPES: dict[str, str] = {}

BATCH = 256
"""Messages appended in one store call at most (a script's arguments are bounded)."""


class Sink(Protocol):
    """Where an :class:`HttpOutbox` sends (its connection)."""

    def route(self, message: Any) -> str | None:
        """The scope of a message; None when it is taken by a waiting caller instead."""
        ...

    async def write(self, messages: list[tuple[str, str]]) -> bool:
        """Append (scope, text) messages to the store; False: the connection is no longer
        this node's (nothing more is sent)."""
        ...

    def lost(self, reason: str) -> None:
        """The connection cannot send any more from here: let it go."""
        ...


class HttpOutbox(Outbox):
    """An :class:`~broker.front.acp.outbox.Outbox` whose frames go to the store's streams."""

    __slots__ = ("_flushing", "_pending", "sink")

    def __init__(
        self,
        sink: Sink,
        conn_id: str,
        max_queue_bytes: int,
        loop: asyncio.AbstractEventLoop,
        lifetime: Lifetime,
    ) -> None:
        super().__init__(_NO_WIRE, conn_id, max_queue_bytes, loop, lifetime)
        self.sink = sink
        self._pending: list[tuple[str, str]] = []
        self._flushing: asyncio.Task[None] | None = None

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
            self.closing = True
            metrics.CLOSES.labels("slow_consumer").inc()
            self.sink.lost("slow store: outgoing messages not written in time")
            return
        if self._flushing is None:
            self._flushing = self._loop.create_task(self._flush())

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
        return self._flushing

    async def flushed(self) -> None:
        """Wait until what was sent so far is in the store."""
        while self._flushing is not None:
            await asyncio.shield(self._flushing)

    async def _flush(self) -> None:
        """Write what waits, a step's worth at a time, until nothing does."""
        try:
            await asyncio.sleep(0)  # what this step of the event loop sends goes together
            while self._pending:
                batch = self._pending[:BATCH]
                del self._pending[:BATCH]
                try:
                    kept = await self.sink.write(batch)
                except Exception as exc:
                    log.warning("could not store messages of %s: %s", self.conn_id, exc)
                    kept = False
                self.queued_bytes -= sum(len(text) for _, text in batch)
                if not kept:
                    self.closing = True
                    self._pending = []
                    self.queued_bytes = 0
                    self.sink.lost("the connection's messages could not be written")
                    return
        finally:
            self._flushing = None


class _NoWire:
    """The socket an :class:`HttpOutbox` has none of (its parent class's writes never run)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"a Streamable HTTP connection has no socket ({name})")


_NO_WIRE: Wire = _NoWire()
