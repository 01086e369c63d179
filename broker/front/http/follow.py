"""Following one session's live events from the HTTP side: a tool's turn, an SSE stream.

A :class:`Follower` joins the front's fan-out hub like a connection does (so it costs
no subscription of its own where a window already watches the session) and queues the
events it is handed, in seq order, each once, from the position :func:`following`
returns. It is no :class:`~broker.front.acp.connection.ClientConnection`: the hub's
router never asks it an agent's question (a permission goes to the windows).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ...store.events import LogEvent
from ..fanout import FanoutHub

QUEUE_LIMIT = 10_000
"""Events a follower holds for a reader that does not keep up; past it the follower is
:attr:`Follower.overflowed` and its reader reads the log again (an SSE stream ends, and
its client resumes with ``Last-Event-ID``)."""


class Follower:
    """A hub subscriber that queues one session's events for one reader."""

    def __init__(self, limit: int = QUEUE_LIMIT) -> None:
        self.id = f"follow-{secrets.token_hex(6)}"
        self.overflowed = False
        self._limit = limit
        self._queue: asyncio.Queue[LogEvent] = asyncio.Queue()

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        """The hub's hand-off (never blocks: a full queue marks the follower overflowed)."""
        if self._queue.qsize() >= self._limit:
            self.overflowed = True
            return
        self._queue.put_nowait(event)

    async def next(self) -> LogEvent:
        """The next event (waits for one)."""
        return await self._queue.get()

    def pending(self) -> list[LogEvent]:
        """Every event queued now, taken out (no wait)."""
        events = []
        while not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events


@asynccontextmanager
async def following(
    hub: FanoutHub, tenant: str, session_id: str
) -> AsyncIterator[tuple[Follower, int]]:
    """A follower of the session and the seq after which it gets every event; it leaves
    the hub on exit. Raises :class:`~broker.store.log.SessionMissing` for no session."""
    follower = Follower()
    last = await hub.join(tenant, session_id, follower)
    try:
        yield follower, last
    finally:
        await hub.leave(tenant, session_id, follower)
