"""One connection's outgoing frames: the only code that writes to a client's socket.

Frames go straight to the socket while it keeps up; behind a backed-up socket they wait in
a bounded queue, drained by a writer task that exists only while the queue is not empty (an
idle connection costs no task), so a slow client never slows another: past the bound it is
disconnected with :data:`CLOSE_SLOW_CONSUMER`.

Event frames, which many connections are sent, are framed once (:func:`wire`) and those of
one step of the event loop are *corked*: gathered and written together, one system call per
connection for a burst of events (one callback writes every connection's, see
:func:`_uncork_all`).

The outbox knows the WebSocket connection only through :class:`Wire`, the few attributes of
``websockets``' ``ServerConnection`` it reads, so it is tested with a stand-in that records
what was written.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from ...ops import metrics
from .lifetime import Lifetime

log = logging.getLogger(__name__)

CLOSE_SLOW_CONSUMER = 4008
"""Close code for a client that reads too slowly (its outgoing queue overflowed)."""
BURST = 512
"""Frames of a run of events (a replay) written at a time, as they are made."""


class WireProtocol(Protocol):
    """What the outbox reads of a connection's Sans-I/O protocol."""

    @property
    def state(self) -> State: ...
    @property
    def extensions(self) -> Any: ...
    def send_text(self, data: bytes, fin: bool = True) -> None: ...


class Wire(Protocol):
    """The part of ``websockets``' ``ServerConnection`` an :class:`Outbox` uses."""

    @property
    def transport(self) -> Any: ...
    @property
    def protocol(self) -> Any: ...
    @property
    def paused(self) -> bool: ...
    @property
    def send_in_progress(self) -> Any: ...
    def send_data(self) -> None: ...
    def send(self, message: str) -> Awaitable[None]: ...
    def close(self, code: int = ..., reason: str = ...) -> Awaitable[None]: ...


class Outbox:
    """The frames one connection is sent, in order, within a bound of queued bytes."""

    __slots__ = (
        "_cork_list",
        "_corked",
        "_lifetime",
        "_loop",
        "_queue",
        "_writer",
        "closing",
        "conn_id",
        "max_queue_bytes",
        "queued_bytes",
        "ws",
    )

    def __init__(
        self,
        ws: Wire,
        conn_id: str,
        max_queue_bytes: int,
        loop: asyncio.AbstractEventLoop,
        lifetime: Lifetime,
    ) -> None:
        self.ws = ws
        self.conn_id = conn_id
        self.max_queue_bytes = max_queue_bytes
        self.closing = False
        """Nothing more is sent (the connection ends, or its queue overflowed)."""
        self.queued_bytes = 0
        self._loop = loop
        self._lifetime = lifetime  # runs coroutines tied to the connection's life
        # Made on first use: most connections never queue a frame, and an empty deque is
        # 760 bytes (at 10,000 idle connections, each byte here is 10 KB).
        self._queue: deque[str] | None = None
        self._writer: asyncio.Task[None] | None = None  # while the queue is not empty
        # Event frames to write once this burst is handed out: a list only while any waits.
        self._corked: list[bytes] | None = None
        self._cork_list: list[Outbox] | None = None  # its event loop's, see _cork_list

    def close(self) -> asyncio.Task[None] | None:
        """Send nothing more; the writer, cancelled (the caller awaits it), if one runs."""
        self.closing = True
        writer = self._writer
        if writer is not None:
            writer.cancel()
        return writer

    # -- sending ------------------------------------------------------------------------------

    def send_text(self, text: str, *, shared: bool = False, alone: bool = False) -> None:
        """Send one frame: at once while the socket keeps up, else through the bounded queue;
        a client that lets the queue overflow is cut off. ``shared``: an event's frame, which
        many connections are sent (its wire bytes are made once, see :func:`wire`);
        ``alone``: no other event frame follows it in this step of the event loop, so it is
        written at once rather than gathered (see :meth:`_write_now`)."""
        if self.closing:
            return
        metrics.FRAMES_SENT.inc()
        metrics.BYTES_SENT.inc(len(text))
        queue = self._queue
        if not queue and self._write_now(text, shared, alone):
            return
        if queue is None:
            queue = self._queue = deque()
        queue.append(text)
        self.queued_bytes += len(text)
        if self.queued_bytes > self.max_queue_bytes:
            self.closing = True
            queue.clear()
            self.queued_bytes = 0
            log.warning("connection %s is too slow; disconnecting it", self.conn_id)
            metrics.CLOSES.labels("slow_consumer").inc()
            self._lifetime.spawn(
                self.ws.close(CLOSE_SLOW_CONSUMER, "slow consumer: outgoing queue full")
            )
            return
        if self._writer is None:
            self._writer = self._loop.create_task(self._write_queue(queue))

    def send_event(self, text: str, alone: bool = False) -> None:
        """:meth:`send_text` of an event's frame (``shared``) in one call: the fan-out's path,
        taken once per event and connection (a thousand watchers: a thousand calls an event),
        so what :meth:`_write_now` does for a frame that goes straight out is done here."""
        ws = self.ws
        protocol = ws.protocol
        if (
            self.closing
            or self._queue
            or ws.paused
            or ws.send_in_progress is not None
            or protocol.state is not State.OPEN
            or protocol.extensions
        ):
            self.send_text(text, shared=True, alone=alone)
            return
        # Tally.inc's work, without two calls a frame.
        _FRAMES_SENT.value += 1
        _BYTES_SENT.value += len(text)
        data = _WIRE.get(text)
        if data is None:
            try:
                data = wire(text)
            except UnicodeEncodeError:
                log.exception("could not send a frame to %s; dropped it", self.conn_id)
                return
        corked = self._corked
        if corked is None:
            if alone:  # see _write_now
                ws.transport.write(data)
                return
            corked = self._cork()
        corked.append(data)

    def send_encoded(self, parts: tuple[bytes, ...]) -> None:
        """Send one frame whose text is ``parts`` in UTF-8 (a reply spliced around a list
        page as it was read): framed with them in one copy and written at once while the
        socket keeps up, else queued as any frame."""
        if not self.writes_directly():
            self.send_text(b"".join(parts).decode())
            return
        size = sum(map(len, parts))
        metrics.FRAMES_SENT.inc()
        metrics.BYTES_SENT.inc(size)
        self._uncork()  # what was written before goes first
        self.ws.transport.write(b"".join((frame_head(size), *parts)))

    def send_run(self, texts: Iterable[str]) -> None:
        """Event frames in order, written together, a burst at a time, as soon as each is
        made (a replay of 10,000 events: the client reads the first frames while the rest
        are made, not once all are); through the queue when the socket is backed up."""
        if not self.writes_directly():
            for text in list(texts):
                self.send_text(text, shared=True)
            return
        burst: list[str] = []
        for text in texts:
            burst.append(text)
            if len(burst) >= BURST:
                self._write_texts(burst)
                burst = []
        self._write_texts(burst)

    def send_each_now(self, frames: Iterable[str]) -> None:
        """Frames each written as soon as it is made (a replay's batches: the client reads
        the first while the rest are made), straight to the transport whatever its buffer
        holds, so that a long history never meets the queue's bound for live traffic;
        through the queue when the socket is backed up already."""
        direct = self.writes_directly()
        for frame in frames:
            if direct:
                self._write_texts([frame])
            else:
                self.send_text(frame)

    def writes_directly(self) -> bool:
        """Whether frames may go straight to the socket (:meth:`_write_texts`): nothing
        queued before them, the socket keeps up, and no extension rewrites frames."""
        ws = self.ws
        return not (
            self.closing
            or self._queue
            or ws.paused
            or ws.send_in_progress is not None
            or ws.protocol.state is not State.OPEN
            or ws.protocol.extensions
        )

    # -- writing ------------------------------------------------------------------------------

    def _write_texts(self, texts: list[str]) -> None:
        """Write event frames now, in one system call, after the frames corked before them
        (the caller checked :meth:`writes_directly`). Frames of one connection (a replay)
        are not kept for others (see :func:`wire`)."""
        if not texts or self.ws.protocol.state is not State.OPEN:
            return
        metrics.FRAMES_SENT.inc(len(texts))
        metrics.BYTES_SENT.inc(sum(map(len, texts)))
        try:
            data = b"".join([framed(text.encode()) for text in texts])
        except UnicodeEncodeError:  # a lone surrogate somewhere: each frame on its own
            data = b"".join(_framed_or_dropped(text, self.conn_id) for text in texts)
        self._uncork()
        self.ws.transport.write(data)

    def _cork(self) -> list[bytes]:
        """The list of frames to write once this step's work is done (one callback writes
        every connection's, see :func:`_uncork_all`), made now if none waits yet."""
        frames = self._corked
        if frames is None:
            frames = self._corked = []
            corked = self._cork_list
            if corked is None:
                corked = _cork_list(self)
            if not corked:
                self._loop.call_soon(_uncork_all, corked)
            corked.append(self)
        return frames

    def _write_now(self, text: str, shared: bool, alone: bool = False) -> bool:
        """Write a frame straight to the socket, as ``websockets.broadcast`` does, when nothing
        waits in the queue before it and the socket is not backed up (no task switch, no
        awaiting); False: it has to go through the queue and the writer."""
        ws = self.ws
        protocol = ws.protocol
        if ws.paused or ws.send_in_progress is not None or protocol.state is not State.OPEN:
            return False
        try:
            if shared and not protocol.extensions:
                # A server's data frame is the same bytes for every connection (unmasked, and
                # no extension rewrites it), so it is framed once, not once per connection.
                # Frames of events that arrive together are written together: one system
                # call per connection for a burst of events, not one per event. A frame that
                # comes alone is written at once: gathering it would only hold it back until
                # every other connection had been handed the event (2 ms at 500 of them).
                if alone and self._corked is None:
                    ws.transport.write(wire(text))
                    return True
                self._cork().append(wire(text))
                return True
            data = text.encode()
        except UnicodeEncodeError:
            log.exception("could not send a frame to %s; dropped it", self.conn_id)
            return True
        self._uncork()  # what was written before goes first
        if ws.protocol.extensions:
            ws.protocol.send_text(data)
            ws.send_data()
        else:  # framed here, as the event frames are: websockets' framing is Python too
            ws.transport.write(framed(data))
        return True

    def _uncork(self) -> None:
        """Write the event frames gathered since the event loop last ran, in one write."""
        corked = self._corked
        if corked is None:
            return
        self._corked = None
        data = corked[0] if len(corked) == 1 else b"".join(corked)
        if self.ws.protocol.state is State.OPEN:
            self.ws.transport.write(data)

    async def _write_queue(self, queue: deque[str]) -> None:
        """Send the queued frames in order, then end (the next queued frame starts another)."""
        try:
            while queue:
                text = queue.popleft()
                self.queued_bytes -= len(text)
                self._uncork()
                try:
                    await self.ws.send(text)
                except ConnectionClosed:
                    self.closing = True
                    queue.clear()
                    self.queued_bytes = 0
                    return
                except (TypeError, ValueError):
                    log.exception("could not send a frame to %s; dropped it", self.conn_id)
        finally:
            self._writer = None
            if not queue and self._queue is queue:
                self._queue = None  # an empty deque is 760 bytes: none while nothing queues


_CORKED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Outbox]] = (
    weakref.WeakKeyDictionary()
)


def _cork_list(outbox: Outbox) -> list[Outbox]:
    """The outboxes of this event loop with frames gathered in the current step: one
    callback (:func:`_uncork_all`) writes them all, not one callback per connection."""
    loop = outbox._loop
    corked = _CORKED.get(loop)
    if corked is None:
        corked = _CORKED[loop] = []
    outbox._cork_list = corked
    return corked


def _uncork_all(corked: list[Outbox]) -> None:
    outboxes = corked[:]
    corked.clear()
    for outbox in outboxes:
        outbox._uncork()


_FRAMES_SENT = metrics.FRAMES_SENT
_BYTES_SENT = metrics.BYTES_SENT
_WIRE: dict[str, bytes] = {}
_WIRE_ENTRIES = 4096
_WIRE_LARGEST = 64 * 1024


def wire(text: str) -> bytes:
    """A text frame as this server puts it on the wire (FIN, unmasked, no extensions).

    Kept for the last few thousand event frames, so an event going to a thousand
    connections is encoded and framed once (the text's hash is computed once too).
    """
    data = _WIRE.get(text)
    if data is None:
        data = framed(text.encode())
        if len(data) <= _WIRE_LARGEST:
            if len(_WIRE) >= _WIRE_ENTRIES:
                _WIRE.clear()
            _WIRE[text] = data
    return data


def framed(data: bytes) -> bytes:
    """A text frame's payload as this server puts it on the wire (FIN, unmasked, no
    extensions: RFC 6455 section 5.2)."""
    return frame_head(len(data)) + data


def frame_head(size: int) -> bytes:
    """The header of a text frame of ``size`` bytes as :func:`framed` makes it."""
    if size < 126:
        return bytes((0x81, size))
    if size < 65536:
        return b"\x81\x7e" + size.to_bytes(2, "big")
    return b"\x81\x7f" + size.to_bytes(8, "big")


def _framed_or_dropped(text: str, conn_id: str) -> bytes:
    try:
        return framed(text.encode())
    except UnicodeEncodeError:
        log.exception("could not send a frame to %s; dropped it", conn_id)
        return b""
