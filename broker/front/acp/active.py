"""The sessions active on one connection: activation, held events, replay, rendering.

Ordering rules live here. While a request that activates a session is being answered, the
session's live events are *held*, so the response precedes them (``session/new``) or
follows a replay and precedes them (``session/load``); ``session/prompt`` answers only once
the connection has been sent every event up to the prompt's end (:meth:`wait_delivered`).

Each event reaches a connection once (:meth:`ActiveSessions._count`), rendered in the
connection's protocol version (v1 ``session/update`` frames, or v2 turns and message ids)
and written through its :class:`~.outbox.Outbox`. The fan-out hub hands live events to the
connection (its subscriber, which the routing of agent requests looks for), which hands
them here; this needs no socket, and its tests feed it events and read the frames its
outbox is given.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from ...auth.principal import Principal
from ...auth.roles import Permission
from ...protocol import capabilities, jsonrpc, v2, v2_render
from ...protocol.interactions import attachment_id
from ...protocol.jsonrpc import JsonObject
from ...protocol.presence import follows_presence
from ...protocol.render import (
    StoredUpdates,
    client_sees_notices,
    follows_interactions,
    is_notice,
    origin_of,
    session_update_frames,
)
from ...store.events import EventRow, EventType, LogEvent, event_of, events_of
from ..fanout import OPT_IN
from ..session_acl import revoke_takes
from .access import session_limit
from .session_lru import let_go_notice, used
from .session_state import ActiveSession

if TYPE_CHECKING:
    from ...auth.principal import Principal
    from ...config import Settings
    from ...store.log import SessionLog
    from ..fanout import FanoutHub
    from ..presence import PresenceBoard
    from .lifetime import Lifetime
    from .outbox import Outbox

_TURN_SCAN = 256
"""Events read per step when looking back for the prompt turn a v2 viewer joins in."""
BATCHED_REPLAY_META = "acpBroker/batchedReplay"
"""The v2 client capability (``capabilities._meta``) that asks for replays in batches."""
ATTACHMENT_EXPIRED = "_acpBroker/attachment_expired"
"""The notification that tells a draft client its attachment expired before its
``session/ready`` (the draft's attachment expiry control message)."""
REPLAY_BATCH_CHARS = 64 * 1024
"""The most a replay's batch frame holds (a browser delivers a page one message at a time,
and 10,000 of them cost it more than parsing the same text in 40 arrays)."""


class Negotiated(Protocol):
    """What the sessions read of their connection: what ``initialize`` settled."""

    id: str
    protocol_version: int | None
    client_capabilities: JsonObject
    principal: Principal | None
    display_name: str | None

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        """The hub's subscriber is the connection: it hands live events on to
        :meth:`ActiveSessions.deliver`."""
        ...


_ACCEPTS = (EventType.PROMPT, EventType.PROMPT_QUEUED)
"""What accepts a prompt: its turn's start, or its place in the session's queue."""
_ENDS = (EventType.PROMPT_END, EventType.PROMPT_WITHDRAWN)
"""What ends a prompt's request: its turn's end, or its withdrawal from the queue."""


class ActiveSessions:
    """The sessions active on one connection, and how far each one's events were sent."""

    __slots__ = (
        "_hub",
        "_lifetime",
        "_log",
        "_notices",
        "_opted",
        "_outbox",
        "_owner",
        "_presence",
        "_settings",
        "_v2",
        "active",
    )

    def __init__(
        self,
        owner: Callable[[], Negotiated | None],
        settings: Settings,
        log: SessionLog,
        hub: FanoutHub,
        outbox: Outbox,
        lifetime: Lifetime,
        presence: PresenceBoard | None = None,
    ) -> None:
        """``owner``: the connection, weakly (it holds this part: no cycle for the collector
        to find; one reference shared by its parts); ``presence``: the front's attachments
        (None: none kept)."""
        self.active: dict[str, ActiveSession] = {}
        self._owner = owner
        self._settings = settings
        self._log = log
        self._hub = hub
        self._outbox = outbox
        self._lifetime = lifetime
        self._notices: bool | None = None  # settled at initialize (see sees_notices)
        self._v2 = False
        self._opted: frozenset[str] = frozenset()  # the OPT_IN types initialize asked for
        self._presence = presence

    @property
    def _conn(self) -> Negotiated:
        conn = self._owner()
        assert conn is not None  # the connection outlives its parts' work (cancelled at its end)
        return conn

    # -- activation -----------------------------------------------------------------------

    async def activate(
        self, tenant: str, session_id: str, *, replay_after: int | None, replay_now: bool
    ) -> int:
        """Make a session active here and hold its live events until :meth:`release`;
        returns the seq of the replay/live boundary (live events are those after it).

        ``replay_after`` None: send only what comes next. Otherwise send every
        event after that seq, now (``replay_now``, for load) or on release.
        """
        if session_id in self.active:  # a coroutine less at each connect's resume otherwise
            await self.deactivate(session_id)
        if len(self.active) >= self._settings.max_sessions_per_connection:
            raise session_limit(self._settings)
        session = ActiveSession(tenant, session_id, held=[])
        used(session)
        self.active[session_id] = session
        conn = self._conn
        try:
            head = await self._hub.join(tenant, session_id, conn)
        except BaseException:
            self.active.pop(session_id, None)
            raise
        self._hub.deaf_to(tenant, session_id, conn, self._deaf_kinds(session))
        if self._presence is not None:  # an implicit attach (session/attach names it)
            self._presence.joined(conn, tenant, session_id)
        if replay_after is None or replay_after >= head:
            session.delivered = head
            if conn.protocol_version == v2.V2:  # v1 has no turns to find: no coroutine made
                session.turn = await self._join_turn(session, head, announce=True)
            return head
        epoch, rows = await self._log.read_rows(tenant, session_id, after=replay_after, until=head)
        if not rows or rows[0][0] != replay_after + 1:
            gap = await self._gap(tenant, session_id, replay_after)
            if gap is not None:
                await self.deactivate(session_id)
                raise gap
        session.delivered = replay_after
        session.turn = await self._join_turn(session, replay_after, announce=False)
        if replay_now:
            self._replay(session, epoch, rows)
        else:
            assert session.held is not None
            session.held[:0] = events_of(rows, epoch)
        return head

    async def _gap(self, tenant: str, session_id: str, after: int) -> jsonrpc.RpcError | None:
        """What refuses a replay after ``after`` when the log no longer holds the events
        right after it: the store dropped the log (an evicting Redis), and it holds none, or
        only what was appended since (a later event made the stream again). A log is never
        cut at its start otherwise. None: no gap to refuse. Seqs a rewound log skipped
        (``store/floors.py``), and a hub that handed out more than the log now holds, leave
        a gap after a position too, but not at the log's start: those are nothing to send."""
        _, first = await self._log.read_rows(tenant, session_id, count=1)
        if not first or first[0][0] > after + 1:
            return jsonrpc.log_lost(session_id)
        return None

    async def _join_turn(self, session: ActiveSession, seq: int, *, announce: bool) -> int | None:
        """The prompt turn open after event ``seq``, which a v2 viewer's message ids need.

        ``announce``: a viewer that joins within a turn with no replay is told the turn's
        state first (``state_update`` ``running``, or ``requires_action``), since the event
        that said so came before what it is sent. (One that resumes from a position saw it.)
        """
        if self._conn.protocol_version != v2.V2:
            return None
        until, state = seq, None
        while until > 0:
            after = max(0, until - _TURN_SCAN)
            events = await self._log.read(
                session.tenant, session.session_id, after=after, until=until
            )
            found, turn, state = v2_render.turn_state(events, state)
            if found:
                if state is not None and announce:
                    update = v2_render.state_update(state)
                    params = {"sessionId": session.session_id, "update": update}
                    self._outbox.send_text(
                        jsonrpc.encode(jsonrpc.notification("session/update", params))
                    )
                return turn
            until = after
        return None

    def subscribe(self, session_id: str, subscriptions: frozenset[str]) -> None:
        """Make the active session a draft attachment sent only ``subscriptions``."""
        session = self.active[session_id]
        session.subscriptions = subscriptions
        self._hub.deaf_to(session.tenant, session_id, self._conn, self._deaf_kinds(session))

    def _deaf_kinds(self, session: ActiveSession) -> frozenset[str]:
        """The opt-in event types this connection drops for ``session`` (see
        :meth:`_frames`), for the hub to hand them to nobody when nobody takes them."""
        if session.subscriptions is not None:
            return frozenset(k for k in OPT_IN if _CATEGORIES[k] not in session.subscriptions)
        self.sees_notices  # noqa: B018  # settles what initialize opted into
        return OPT_IN - self._opted

    def hold(self, session_id: str) -> None:
        """Hold the session's live events back until :meth:`release` (a reply goes first)."""
        session = self.active.get(session_id)
        if session is not None and session.held is None:
            session.held = []

    def release(self, session_id: str) -> None:
        """Send the events held back while a session was being activated."""
        session = self.active.get(session_id)
        if session is None or session.held is None:
            return
        held, session.held = session.held, None
        held.sort(key=lambda e: e.seq)
        self._emit_many(session, held, replay=False)

    async def deactivate(self, session_id: str) -> None:
        session = self._dropped(session_id)
        if session is not None:
            await self._hub.leave(session.tenant, session_id, self._conn)

    def _dropped(self, session_id: str) -> ActiveSession | None:
        """The session no longer active here (its waiters woken, its attachment ended);
        the hub is left by the caller."""
        session = self.active.pop(session_id, None)
        if session is not None:
            for _, waiter in session.waiters or ():
                if not waiter.done():
                    waiter.set_result(None)
            if self._presence is not None:
                self._presence.left(self._conn.id, session_id)
        return session

    async def expire(self, session_id: str, reason: str) -> None:
        """End a draft attachment that did not cross its delivery barrier in time (or whose
        buffer filled first): its buffer dropped, the client told
        (``_acpBroker/attachment_expired``)."""
        session = self.active.get(session_id)
        if session is None or session.barrier is None:
            return
        session.held = None
        await self.deactivate(session_id)
        attachment = attachment_id(session_id, self._conn.id)
        params = {"sessionId": session_id, "attachmentId": attachment, "reason": reason}
        notice = jsonrpc.notification(ATTACHMENT_EXPIRED, params)
        self._outbox.send_text(jsonrpc.encode(notice))

    def _narrowed(self, session_id: str) -> None:
        """A revoke took ``session.read`` from the connection's principal: the session stops
        being active here at once (no event after the revoke reaches it), and the client
        is told so; loading it again is refused (``forbidden``)."""
        session = self._dropped(session_id)
        if session is None:
            return
        self._lifetime.spawn(self._hub.leave(session.tenant, session_id, self._conn))
        if self.sees_notices:
            self._outbox.send_text(jsonrpc.encode(_revoked_notice(session_id)))

    async def leave_all(self) -> None:
        """Leave every session (the connection ended)."""
        for session in list(self.active.values()):
            if self._presence is not None:
                self._presence.left(self._conn.id, session.session_id)
            await self._hub.leave(session.tenant, session.session_id, self._conn)
        self.active.clear()

    # -- prompts ----------------------------------------------------------------------------

    def expect_prompt(self, session_id: str, prompt_id: str) -> asyncio.Future[LogEvent]:
        """A future for the ``prompt`` event ``prompt_id``, once it reaches here."""
        future: asyncio.Future[LogEvent] = asyncio.get_running_loop().create_future()
        session = self.active.get(session_id)
        if session is not None:
            session.prompts = session.prompts or {}
            session.prompts[prompt_id] = future
        return future

    def forget_prompt(self, session_id: str, prompt_id: str) -> None:
        session = self.active.get(session_id)
        if session is not None and session.prompts is not None:
            session.prompts.pop(prompt_id, None)

    def expect_prompt_end(self, session_id: str, prompt_id: str) -> asyncio.Future[LogEvent]:
        """A future for the ``prompt_end`` event of ``prompt_id``, once it reaches here."""
        future: asyncio.Future[LogEvent] = asyncio.get_running_loop().create_future()
        session = self.active.get(session_id)
        if session is not None:
            session.prompt_ends = session.prompt_ends or {}
            session.prompt_ends[prompt_id] = future
        return future

    def forget_prompt_end(self, session_id: str, prompt_id: str) -> None:
        session = self.active.get(session_id)
        if session is not None and session.prompt_ends is not None:
            session.prompt_ends.pop(prompt_id, None)

    async def wait_delivered(self, session_id: str, seq: int, timeout: float = 10.0) -> None:
        """Wait until every event up to ``seq`` of the session has been queued here."""
        session = self.active.get(session_id)
        if session is None or session.delivered >= seq:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session.waiters = session.waiters or []
        session.waiters.append((seq, future))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, timeout)

    # -- delivery ---------------------------------------------------------------------------

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        """A live event from the hub; ``alone``: the only one it hands out in this step."""
        session = self.active.get(session_id)
        if session is None:
            return
        if session.prompts and event.type in _ACCEPTS:
            accepted = session.prompts.pop(str(event.body.get("promptId")), None)
            if accepted is not None and not accepted.done():
                accepted.set_result(event)
        if session.prompt_ends and event.type in _ENDS:
            ended = session.prompt_ends.pop(str(event.body.get("promptId")), None)
            if ended is not None and not ended.done():
                ended.set_result(event)
        held = session.held
        if held is not None:
            held.append(event)
            if session.barrier is not None and len(held) > self._settings.attach_buffer_events:
                reason = "its buffer filled before session/ready"
                self._lifetime.spawn(self.expire(session_id, reason))
            return
        # What :meth:`_delivered` does, in this call: this runs once per event and connection.
        seq = event.seq
        if seq <= session.delivered:
            return
        session.delivered = seq
        if session.waiters:
            _wake_waiters(session)  # they resume once this step has sent the frames
        frames = self._frames(session, event, False)
        if event.type == EventType.DELETED:
            self._lifetime.spawn(self.deactivate(session_id))
        elif event.type == EventType.SESSION_ACCESS and revoke_takes(
            event.body, self._conn.principal, Permission.READ
        ):
            self._narrowed(session_id)
        send = self._outbox.send_event
        for text in frames:
            send(text, alone)

    def _replay(self, session: ActiveSession, epoch: str, rows: list[EventRow]) -> None:
        """Send a session's history (rows of log ``epoch``): a frame per message, or, to a
        client that asked for them (:func:`batches_replay`), the same messages in order in
        batch arrays."""
        texts = self._replayed(session, epoch, rows)
        if not batches_replay(self._conn):
            self._outbox.send_run(texts)
            return
        self._outbox.send_each_now(jsonrpc.pack_batches(texts, REPLAY_BATCH_CHARS))

    def _replayed(self, session: ActiveSession, epoch: str, rows: list[EventRow]) -> Iterator[str]:
        """The frames of a replay, in order, as :meth:`_delivered` makes them of each event:
        a plain update's (most of a history) straight from its stored text, for a v1 client
        (:class:`StoredUpdates`) or, a message chunk, for a v2 one (:class:`StoredChunks`);
        any other from the event parsed."""
        v2_chunks = self._conn.protocol_version == v2.V2
        chunks = v2_render.StoredChunks(session.session_id, epoch) if v2_chunks else None
        stored = StoredUpdates(session.session_id, epoch)
        for row in rows:
            seq, text = row[0], row[2]
            if chunks is None:
                frame = stored.frame(text, seq)
            else:  # a chunk's id depends on the turn, which the events before it set
                frame = chunks.frame(text, seq, session.turn)
            if frame is None:
                yield from self._delivered(session, event_of(row, epoch), replay=True)
            elif self._count(session, seq):
                yield frame

    def _count(self, session: ActiveSession, seq: int) -> bool:
        """Count event ``seq`` as delivered here; False when it was delivered before (each
        event reaches a connection once)."""
        if seq <= session.delivered:
            return False
        session.delivered = seq
        if session.waiters:
            _wake_waiters(session)  # they resume once this step has sent the frames
        return True

    def _delivered(self, session: ActiveSession, event: LogEvent, *, replay: bool) -> list[str]:
        """Count ``event`` as delivered here and return its frames to send at once (none
        when it was delivered before)."""
        if not self._count(session, event.seq):
            return []
        frames = self._frames(session, event, replay)
        if event.type == EventType.DELETED:
            self._lifetime.spawn(self.deactivate(session.session_id))
        return frames

    def _emit_many(self, session: ActiveSession, events: list[LogEvent], *, replay: bool) -> None:
        """Events in order, as :meth:`deliver` sends each, their frames written together (see
        :meth:`~.outbox.Outbox.send_run`)."""
        self._outbox.send_run(
            t for event in events for t in self._delivered(session, event, replay=replay)
        )

    # -- rendering --------------------------------------------------------------------------

    def _frames(self, session: ActiveSession, event: LogEvent, replay: bool) -> list[str]:
        """What this connection is sent for an event, in its protocol version."""
        notices = self._notices
        if notices is None:
            notices = self.sees_notices
        subscribed = session.subscriptions
        if subscribed is not None:  # a draft attachment: its subscriptions decide
            if _category(event) not in subscribed:
                return []
        elif event.type in OPT_IN and event.type not in self._opted:
            return []
        if self._v2:
            turn, session.turn = session.turn, v2_render.next_turn(event, session.turn)
            if replay and is_notice(event):
                return []  # notices are live only (the notices RFD)
            return _v2_frames(event, session.session_id, turn)
        notice = notices and is_notice(event)
        if replay and notice:
            return []
        # v1: the window that typed a prompt does not get it echoed back (live).
        if not replay and event.type == EventType.PROMPT and origin_of(event) == self._conn.id:
            return []
        frames = event.frames.get("v1:notices" if notice else "v1")
        return _frames(event, session.session_id, notice) if frames is None else frames

    @property
    def sees_notices(self) -> bool:
        """Whether this client takes ``notice`` updates (else it gets agent message stand-ins)."""
        if self._notices is None:
            conn = self._conn
            version = conn.protocol_version
            if version is None:
                return False
            # Both settled at ``initialize``, once: kept, not read through the connection at
            # every event.
            self._v2 = version == v2.V2
            self._notices = client_sees_notices(version, conn.client_capabilities)
            # An implicit attachment takes interaction records and presence only if asked.
            asked = {
                EventType.INTERACTION: follows_interactions(conn.client_capabilities),
                EventType.PRESENCE: follows_presence(conn.client_capabilities),
            }
            self._opted = frozenset(kind for kind, yes in asked.items() if yes)
        return self._notices


_CATEGORIES: dict[str, str] = {
    EventType.INTERACTION: "pending_interactions",
    EventType.PRESENCE: "presence",
}
"""The draft's subscription each opt-in event type is delivered under (any other: events)."""


def _category(event: LogEvent) -> str:
    """The draft's subscription an event is delivered under."""
    return _CATEGORIES.get(event.type, "events")


def _wake_waiters(session: ActiveSession) -> None:
    still = []
    for seq, future in session.waiters or ():
        if seq <= session.delivered:
            if not future.done():
                future.set_result(None)
        else:
            still.append((seq, future))
    session.waiters = still or None


def _frames(event: LogEvent, session_id: str, notice: bool) -> list[str]:
    """The v1 frames of an event, made once and kept on it for every v1 viewer (``notice``:
    of a notice, for those that take notices; those that do not are kept apart)."""
    frames = session_update_frames(event, session_id, notice)
    event.frames["v1:notices" if notice else "v1"] = frames
    return frames


def _v2_frames(event: LogEvent, session_id: str, turn: int | None) -> list[str]:
    """The v2 frames of an event in a turn, serialized once and shared by every v2 viewer."""
    key = v2_render.frame_key(turn)
    frames = event.frames.get(key)
    if frames is None:
        frames = [jsonrpc.encode(m) for m in v2_render.session_updates(event, session_id, turn)]
        event.frames[key] = frames
    return frames


def batches_replay(conn: Negotiated) -> bool:
    """Whether a client asked at ``initialize`` for replays in JSON-RPC batch arrays
    (``capabilities._meta["acpBroker/batchedReplay"]: true``; ACP v2 only, whose transports
    follow JSON-RPC's batch rules). Every other client gets one per frame."""
    if conn.protocol_version != v2.V2:
        return False
    return capabilities.opted_in(conn.client_capabilities, BATCHED_REPLAY_META)


def _revoked_notice(session_id: str) -> JsonObject:
    """What a client that takes notices is told when a revoke took its read of a session."""
    text = (
        "Your access to this session was revoked: it is no longer followed on this "
        "connection, and loading it again is refused."
    )
    return let_go_notice(session_id, "Access to the session revoked", text)
