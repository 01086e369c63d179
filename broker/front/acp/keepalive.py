"""Keepalive pings for every connection of a front, from one loop (not a task each).

websockets pings each connection from a task of its own (a sleep, a future and a timeout
context per ping): at 19,488 connections that is 975 task wake-ups a second, each allocating,
and a task and its sleep held by every idle connection. :class:`Keepalive` keeps the same
rule, every connection pinged every ``interval`` and closed (1011, "keepalive ping timeout",
as websockets closes it) when the pong has not come ``timeout`` after the ping and nothing
else came from the peer meanwhile (any bytes show it alive: its Pong may sit behind its
requests or behind our replies it has yet to read; nor does the time the front's flow control
held the connection's reading back count: a paced client is slowed, never cut off for it),
from one loop: the connections sit in ``interval / tick``
slots, one slot visited per tick, and a visit writes a prepared Ping frame to each of its
connections' sockets or, for one whose last ping is still unanswered past the timeout,
closes it.

The connections are dealt to the slots in turn, whenever they open, so that every visit
pings about as many: clients arrive in bursts (a node's clients reconnecting here at once),
and joining the slot visited last put a burst's connections into the few slots visited while
it lasted. At 19,488 connections joined in 7 s, 70 of the 200 slots held 200-430 each and
the rest none; each of those visits wrote 300 Pings in 3-4 ms (up to 9 ms, p99) and as many
Pongs came back at once, a stall of the fan-outs beside them every tick (``bench c50k``).
A connection is first pinged a tick to an ``interval`` after it opened (websockets: an
``interval``); how long a Pong may take stays the same.

A visit takes as many slots in turn as hold about :data:`BATCH` connections, so that a front
with few connections does not wake every tick for a Ping or two (or none): each wake of an
idle process costs ~0.2 ms of CPU on a small VM whatever it does, and 50 a second were most
of what an idle front burned (1.8% of a core with no connection at all; ``bench fanout``
S=1/W=1000 at 20 updates/s: ~2 µs of the fronts' ~28 µs of CPU per delivery). 500
connections are pinged ~20 at a time, a visit every 0.8 s; 19,488 still a slot a tick.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from websockets.frames import CloseCode
from websockets.protocol import State

from ...compat.websockets import HookedServerConnection
from ...loops import cancel_and_wait

log = logging.getLogger(__name__)

PAYLOAD = b"acpb"
"""What every keepalive Ping carries: the Pong that echoes it answers it."""
PING_FRAME = bytes((0x89, len(PAYLOAD))) + PAYLOAD
"""A server's Ping frame (FIN, unmasked): the same bytes for every connection."""
CLOSE_GRACE = 10.0
"""Seconds a connection closed for an overdue Pong has to close its end: websockets'
``close_timeout`` when the connection has one, and never more than the ping timeout."""
TICK = 0.02
"""Seconds a slot stands for (at most: :func:`slots` keeps at least 2 slots). Short, so
that a busy visit is short: 1,000 slots at the default 20 s interval, ~20 Pings a visit at
19,488 connections (0.1 s: 97, about 1.2 ms of writes and then as many Pongs to read)."""
BATCH = 20
"""Pings a visit aims at: it takes as many slots as hold about this many connections."""
MAX_WAIT = 1.0
"""Seconds at most between two visits (and never more than a quarter of the interval): how
late a Ping may come, and how much sooner than ``timeout`` an unanswered one may be
declared overdue."""


class PingedConnection(HookedServerConnection):
    """A server connection whose keepalive pings come from a :class:`Keepalive`: it notes
    when the Pong of the last one came (the others go to websockets, as a pong of
    :meth:`ping` does)."""

    ping_sent: float | None = None
    """When the keepalive Ping now unanswered was sent (None: none is); while the front
    holds reading back, when it last did (see :meth:`reading_held`)."""
    keepalive_slot: int = -1
    pongs: int = 0
    """Keepalive Pongs received (tests and diagnostics)."""
    held: bool = False
    """Whether the front holds this connection's reading back now (flow control: see
    :mod:`.flow`)."""

    def reading_held(self, held: bool, now: float) -> None:
        """The front starts (True) or stops (False) holding this connection's reading back.

        A client that pipelines faster than its pace is read only as fast as its pace: its
        Pong waits behind its requests, in websockets' queue and in TCP, unread. That time
        is the front's, not the client's, so it does not count against the Pong: a Ping
        unanswered when the hold ends is given a whole timeout from then (and one overdue
        during a hold, from the visit that finds it so)."""
        self.held = held
        if not held and self.ping_sent is not None:
            self.ping_sent = now

    def pong_received(self, data: bytes) -> bool:
        if data != PAYLOAD:
            return False
        self.ping_sent = None
        self.pongs += 1
        return True


def slots(interval: float) -> int:
    """How many slots a ping interval is split into (a tick of about :data:`TICK`)."""
    return max(2, round(interval / TICK))


class Keepalive:
    """Pings every connection added every ``interval`` seconds, a slot at a time; closes
    those whose Pong is overdue by ``timeout``."""

    def __init__(self, interval: float, timeout: float) -> None:
        self.interval = interval
        self.timeout = timeout
        self._slots: list[set[PingedConnection]] = [set() for _ in range(slots(interval))]
        self.tick = interval / len(self._slots)
        self.max_span = max(1, min(len(self._slots) // 4, round(MAX_WAIT / self.tick)))
        """The most slots one visit takes."""
        self._count = 0  # connections in the slots
        self._next = 0  # the slot the next visit starts at
        self._deal = 0  # the slot the next connection joins
        self._closing: set[asyncio.Task[None]] = set()
        self.timed_out = 0
        """Connections closed for an overdue Pong."""

    def add(self, ws: PingedConnection) -> None:
        """Ping ``ws`` from now on, first within ``interval`` seconds."""
        slot = self._deal
        self._deal = (slot + 1) % len(self._slots)
        ws.keepalive_slot = slot
        self._slots[slot].add(ws)
        self._count += 1

    def discard(self, ws: PingedConnection) -> None:
        if ws.keepalive_slot >= 0:
            self._slots[ws.keepalive_slot].discard(ws)
            ws.keepalive_slot = -1
            self._count -= 1

    def span(self) -> int:
        """How many slots the next visit takes: about :data:`BATCH` connections' worth,
        from one to :attr:`max_span`."""
        if not self._count:
            return self.max_span
        return max(1, min(self.max_span, BATCH * len(self._slots) // self._count))

    async def stop(self) -> None:
        """Cancel the closes under way (:meth:`run`, a loop of the front's, stops with them)."""
        await cancel_and_wait(*self._closing)

    async def run(self) -> None:
        """Visit the slots, a tick apart, until cancelled (a loop of the front's
        :class:`~broker.lifetimes.RoleLoops`)."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            planned = self.span()
            await asyncio.sleep(max(0.0, due + planned * self.tick - loop.time()))
            # Connections that joined meanwhile (a burst after an idle spell) shorten the
            # visit, and the slots left are visited in the steps that follow. A loop that
            # fell behind (a long collection) catches up a visit per step.
            span = min(planned, self.span())
            due += span * self.tick
            try:
                self.visit(loop.time(), span)
            except Exception:  # a fault in one visit must not end the keepalive of all
                log.exception("keepalive visit failed")

    def visit(self, now: float, span: int = 1) -> None:
        """The next ``span`` slots' turn: ping each of their connections, or close one whose
        Pong is overdue."""
        # The visits of one connection are an interval apart, give or take the loop's
        # lateness and where its slot falls in a visit's span (up to a whole span when the
        # spans change): a ping unanswered at the turn that comes ``timeout`` after it
        # (within the longest span) is overdue.
        overdue = now - self.timeout + (self.max_span - 0.5) * self.tick
        for _ in range(span):
            self._visit_slot(self._slots[self._next], now, overdue)
            self._next = (self._next + 1) % len(self._slots)

    def _visit_slot(self, slot: set[PingedConnection], now: float, overdue: float) -> None:
        for ws in list(slot):
            sent = ws.ping_sent
            if sent is None:
                if ws.protocol.state is State.OPEN:
                    ws.ping_sent = now
                    ws.heard = False
                    ws.transport.write(PING_FRAME)
            elif sent <= overdue:
                # Held: its Pong waits behind requests the front has not read yet. Heard: it
                # sent since the Ping, so it is alive (its Pong may wait behind what it sent,
                # or what it has yet to read of ours).
                if ws.held or ws.heard:
                    ws.ping_sent = now
                    ws.heard = False
                else:
                    self.discard(ws)
                    self._close(ws)

    def _close(self, ws: PingedConnection) -> None:
        """Close ``ws`` as websockets' keepalive does when a Pong is overdue."""
        self.timed_out += 1
        grace = min(ws.close_timeout or CLOSE_GRACE, self.timeout)
        closer = asyncio.get_running_loop().create_task(_fail(ws, grace))
        self._closing.add(closer)
        closer.add_done_callback(self._closing.discard)


async def _fail(ws: Any, grace: float) -> None:
    """A Close frame (1011) and the end of the stream, as websockets' keepalive fails a
    connection; the socket aborted if the peer has not closed its end ``grace`` seconds
    later (a dead peer never does, and its unread bytes would hold the socket open)."""
    if ws.protocol.state is not State.OPEN:
        return
    ws.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
    ws.send_data()
    try:
        async with asyncio.timeout(grace):
            await asyncio.shield(ws.connection_lost_waiter)
    except TimeoutError:
        ws.transport.abort()
