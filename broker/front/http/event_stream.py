"""``GET /v1/sessions/{id}/events``: a session's events as Server-Sent Events.

Each event goes out as ``id: <seq>``, ``event: <type>`` and one ``data:`` line (the
event as JSON: ``seq``, ``epoch``, ``ts`` and its body under ``event``). A client that
reconnects sends ``Last-Event-ID`` (or ``?after=``) and gets every event after that
seq, none twice: the stream joins the front's live feed first (:func:`.follow.following`),
sends the log up to where the feed starts, then the feed. It runs until the client
leaves, with a comment line every :data:`HEARTBEAT_SECONDS` so that proxies keep it open,
or until a revoke takes ``session.read`` from its reader (:meth:`.SessionAcl.lost_read`):
the revoke's own event is the stream's last (a reconnect is then refused, 403), as an ACP
connection stops delivery.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ... import fastjson
from ...errors import invalid_argument
from ...store.events import EventType, LogEvent
from ...store.log import SessionLog
from ..fanout import FanoutHub
from ..session_acl import Fence
from .follow import following

HEARTBEAT_SECONDS = 15.0
HISTORY_PAGE = 500
"""Events read from the log per round trip while sending history."""
RETRY_MS = 2000
"""The reconnection delay the stream asks of clients (``retry:``)."""
MEDIA_TYPE = "text/event-stream"


def resume_after(last_event_id: str | None, after: str | None) -> int:
    """Where a stream starts: after ``Last-Event-ID`` (a reconnect), else ``?after=``, else
    the start of the log."""
    value = last_event_id if last_event_id is not None else after
    if value is None or value == "":
        return 0
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise invalid_argument("Last-Event-ID and after must be an event seq (an integer >= 0)")
    return int(value)


def frame(event: LogEvent) -> bytes:
    """One event as an SSE frame (an ACL change without its entry: who holds which roles
    is for owners to read, at ``…/access``)."""
    body = event.body
    if event.type == EventType.SESSION_ACCESS:
        body = {k: v for k, v in body.items() if k != "entry"}
    data = fastjson.dumps({"seq": event.seq, "epoch": event.epoch, "ts": event.ts, "event": body})
    return f"id: {event.seq}\nevent: {event.type or 'event'}\ndata: {data}\n\n".encode()


class EventStream:
    """The SSE streams of a front (``heartbeat``: seconds between comment lines)."""

    def __init__(
        self, log: SessionLog, hub: FanoutHub, *, heartbeat: float = HEARTBEAT_SECONDS
    ) -> None:
        self.log = log
        self.hub = hub
        self.heartbeat = heartbeat

    async def frames(
        self, tenant: str, session_id: str, after: int, fence: Fence | None = None
    ) -> AsyncIterator[bytes]:
        """The stream's bytes: the history after ``after``, then live events, up to and
        including the first that ``fence`` says took the reader's ``session.read``."""

        async def ends(event: LogEvent) -> bool:
            return fence is not None and await fence(event)

        yield f"retry: {RETRY_MS}\n\n".encode()
        async with following(self.hub, tenant, session_id) as (follower, live_from):
            sent = after
            while sent < live_from:
                events = await self.log.read(
                    tenant, session_id, after=sent, until=live_from, count=HISTORY_PAGE
                )
                if not events:
                    break
                for event in events:
                    yield frame(event)
                    if await ends(event):
                        return
                sent = events[-1].seq
            while not follower.overflowed:  # overflowed: the client resumes from its last id
                try:
                    event = await asyncio.wait_for(follower.next(), self.heartbeat)
                except TimeoutError:
                    yield b": heartbeat\n\n"
                    continue
                if event.seq > sent:
                    yield frame(event)
                    sent = event.seq
                    if await ends(event):
                        return
