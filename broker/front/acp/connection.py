"""One client connection: what ``initialize`` negotiated, put together from its parts.

A connection is three parts, as ``websockets`` splits a protocol from its I/O:

- :class:`~.intake.Intake`: the requests, from the frame that carries them (parsed, paced,
  in flight, batched) to their answers; no socket;
- :class:`~.outbox.Outbox`: the frames sent (queue bound, framing, corking); the only
  part that writes to the socket;
- :class:`~.active.ActiveSessions`: the sessions active here (activation, held events,
  replay, v1/v2 rendering), the fan-out hub's subscriber, writing through the outbox.

:class:`ClientConnection` reads the socket (:meth:`~ClientConnection.run`, and
:meth:`~ClientConnection.frame_in` in the step websockets parses a frame), holds what the
methods read and set (principal, tenant, protocol version, capabilities), and sends the
client requests of its own (:meth:`~ClientConnection.request_client`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from ...auth.principal import Principal
from ...config import Settings
from ...ops import metrics
from ...protocol import jsonrpc, v2
from ...protocol.jsonrpc import JsonObject, Request, Response
from ...protocol.pending import PeerGone, PendingRequests
from ...store.events import LogEvent
from ...store.log import SessionLog
from ..fanout import FanoutHub
from .access import LOGINS_PER_SECOND
from .active import BATCHED_REPLAY_META, ActiveSessions, batches_replay
from .flow import Pace, waiting_bound
from .intake import Dispatcher as RequestDispatcher
from .intake import Intake
from .keepalive import PingedConnection
from .lifetime import Lifetime
from .outbox import CLOSE_SLOW_CONSUMER, Outbox
from .session_lru import make_room
from .session_state import ActiveSession

__all__ = [
    "BATCHED_REPLAY_META",
    "CLOSE_GOING_AWAY",
    "CLOSE_SLOW_CONSUMER",
    "ClientConnection",
    "Dispatcher",
]

CLOSE_GOING_AWAY = 1001
"""Close code when the broker shuts down: reconnect (to any node)."""
CLOSE_POLICY = 1008
UNREAD_BACKLOG = "more than max_queue_bytes sent and waiting for the connection's pace"
"""Why a connection is closed whose frames with no request (answers, notifications) pile up
past ``max_queue_bytes`` behind its paced requests (requests past it are refused instead)."""


OutboxMaker = Callable[[str, Lifetime], Outbox]
"""Makes a connection's outbox, given the connection's id and lifetime."""


class Dispatcher(RequestDispatcher, Protocol):
    """The ACP methods, as a connection is given them: what answers its requests
    (:class:`~.intake.Dispatcher`), and the hub and log its sessions are read from."""

    log: SessionLog
    hub: FanoutHub


class ClientConnection:
    """The broker's side of one WebSocket connection."""

    # Slots: an idle connection's memory is most of a front's at many connections.
    __slots__ = (
        "__weakref__",
        "_idle",
        "_login_attempts",
        "_pending",
        "_waiting",
        "_waiting_bytes",
        "client_capabilities",
        "client_instance",
        "display_name",
        "id",
        "intake",
        "lifetime",
        "methods",
        "outbox",
        "pace",
        "principal",
        "protocol_version",
        "sessions",
        "taps",
        "tenant",
        "unauthenticated_since",
        "ws",
    )

    def __init__(
        self,
        ws: ServerConnection,
        methods: Dispatcher,
        *,
        principal: Principal | None,
        conn_id: str | None = None,
        outbox: OutboxMaker | None = None,
    ) -> None:
        """``outbox``: makes the part that sends (another transport's); by default an
        :class:`~.outbox.Outbox` writing to ``ws``."""
        self.ws = ws
        self.id = conn_id or str(ws.id)  # given: the caller had made it already
        # Looked up once, for the parts: on Python 3.11 each lookup of the running loop is a
        # getpid() system call, ten a request before (13% of a front's samples under
        # session/list).
        loop = asyncio.get_running_loop()
        self.methods = methods
        settings = methods.settings
        self.principal = principal
        self.tenant = principal.tenant if principal else ""
        self.unauthenticated_since: float | None = None if principal else time.monotonic()
        self.pace = Pace(settings.rate_per_connection)
        # Made on first use: few connections log in or ask the client anything, and every
        # object made is a connect's work and an idle connection's memory.
        self._login_attempts: Pace | None = None
        self._pending: PendingRequests | None = None  # the client's answers awaited
        self.protocol_version: int | None = None
        self.client_capabilities: JsonObject = {}
        self.client_instance = ""
        self.display_name: str | None = None
        """The name the client shares with the session's peers (presence), from
        ``initialize``."""
        """The client installation's id given at ``initialize`` (``""``: none given)."""
        self.taps: dict[Any, Callable[[Any], None]] | None = None
        """Who hears a request's result as :meth:`reply` sends it, by request id (the
        operation ledger records what a method answered itself)."""
        self._idle = False  # whether :meth:`run` waits for a message, none queued (frame_in)
        # Frames (and their bytes) read and queued in websockets for :meth:`run`: their pace
        # holds them (see :meth:`frame_in`).
        self._waiting = 0
        self._waiting_bytes = 0
        # The parts hold the connection weakly (it holds them), all by this one reference.
        owner = weakref.ref(self)
        self.lifetime = lifetime = Lifetime(loop)
        if outbox is None:
            self.outbox = Outbox(ws, self.id, settings.max_queue_bytes, loop, lifetime)
        else:
            self.outbox = outbox(self.id, lifetime)
        pinged = isinstance(ws, PingedConnection)
        self.intake = Intake(owner, methods, self.outbox, lifetime, loop, holds=pinged)
        self.sessions = ActiveSessions(
            owner,
            settings,
            methods.log,
            methods.hub,
            self.outbox,
            lifetime,
            getattr(methods, "presence", None),  # the front's; none in a bare method table
        )

    # -- reading ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes, then leave every session."""
        ws = self.ws
        try:
            while True:
                # websockets' queue holds no message while this waits (its get returns at
                # once when one is queued), so a message read now may be taken at once.
                self._idle = True
                try:
                    frame = await ws.recv()
                finally:
                    self._idle = False
                if self._waiting:
                    self._waiting -= 1
                    self._waiting_bytes = max(0, self._waiting_bytes - len(frame))
                if isinstance(frame, str):
                    await self.intake.take_frame(frame)
                # An idle connection waits for its next frame here: it does not keep its
                # last one, and what that parsed to, meanwhile (~700 B each).
                del frame
        except ConnectionClosed:
            pass
        finally:
            writer = self.outbox.close()
            self.lifetime.cancel_all()
            if self._pending is not None:
                self._pending.fail_all("the client disconnected")
            await self.sessions.leave_all()
            if writer is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await writer

    def frame_in(self, frame: Frame) -> bool:
        """A message's last frame, as websockets parses it (``data_received``): True when it
        was taken in that step, no task woken to read it (a text message that needs no wait,
        while :meth:`run` waits for the next one; or one whose requests are refused, more
        frames waiting for the pace than it serves within ``max_pace``: :mod:`.flow`); False
        leaves it to websockets' queue and :meth:`run`, and every message after it until
        :meth:`run` reads on (none overtakes another but a refused one)."""
        if frame.opcode is Opcode.TEXT and frame.fin:
            idle = self._idle
            settings = self.methods.settings
            # As many wait for the pace as it serves within max_pace: a request read now is
            # refused (or ``max_queue_bytes`` of them wait).
            if (
                idle
                or self._waiting >= waiting_bound(settings.rate_per_connection, settings.max_pace)
                or self._waiting_bytes >= settings.max_queue_bytes
            ):
                try:
                    text: str | None = bytes(frame.data).decode()
                except UnicodeDecodeError:  # websockets' queue fails the connection as it does
                    text = None
                intake = self.intake
                if text is not None and (
                    intake.take_frame_now(text) if idle else intake.refuse_frame_now(text)
                ):
                    return True
                if not idle and self._waiting_bytes >= settings.max_queue_bytes:
                    # Frames with no request (never refused) past the bound: no queue grows
                    # without end behind a paced request.
                    if self.ws.protocol.state is State.OPEN:  # closed once
                        metrics.CLOSES.labels("unread_backlog").inc()
                        self.lifetime.spawn(self.ws.close(CLOSE_POLICY, UNREAD_BACKLOG))
                    return True
        self._idle = False
        self._waiting += 1
        self._waiting_bytes += len(frame.data)
        return False

    def reading_held(self, held: bool) -> None:
        """Pacing holds (True) or stops holding (False) this connection's reading back: the
        keepalive waits for its Pongs meanwhile (they queue behind the requests)."""
        ws = self.ws
        assert isinstance(ws, PingedConnection)
        ws.reading_held(held, self.lifetime.loop.time())

    def answers_for_client(self, message: Response) -> None:
        """The client's answer to one of :meth:`request_client`'s requests."""
        if self._pending is not None:
            self._pending.resolve(message)

    @property
    def settings(self) -> Settings:
        """The node's settings (its methods')."""
        return self.methods.settings

    @property
    def login_attempts(self) -> Pace:
        """The pace of this connection's login attempts (ACP ``authenticate``)."""
        pace = self._login_attempts
        if pace is None:
            pace = self._login_attempts = Pace(LOGINS_PER_SECOND)
        return pace

    def cut(self, code: int, reason: str) -> None:
        """Close the connection now: its credential is no longer good (nothing more of it is
        answered; its prompts go on in their agent hosts)."""
        self.principal, self.unauthenticated_since = None, None
        self.lifetime.spawn(self.ws.close(code, reason))

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for the requests in flight to be answered (see
        :meth:`~.intake.Intake.drain`)."""
        await self.intake.drain(timeout)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run work tied to this connection's life."""
        return self.lifetime.spawn(coro)

    # -- sending ----------------------------------------------------------------------------

    def reply(self, request: Request, result: Any) -> None:
        """Answer a request now (handlers that must order the reply use this, then DEFERRED)."""
        if self.taps is not None and (tap := self.taps.pop(request.id, None)) is not None:
            tap(result)
        self.intake.reply(request, result)

    def send(self, message: JsonObject) -> None:
        """Queue one message; a reply to a request of a batch joins the batch's array."""
        self.intake.send(message)

    def send_text(self, text: str, *, shared: bool = False, alone: bool = False) -> None:
        """Send one frame (see :meth:`~.outbox.Outbox.send_text`)."""
        self.outbox.send_text(text, shared=shared, alone=alone)

    @property
    def _queued_bytes(self) -> int:
        """Bytes waiting in the outbox's queue (tests and diagnostics)."""
        return self.outbox.queued_bytes

    async def request_client(self, method: str, params: JsonObject) -> Any:
        """Send a request to the client and wait for its answer.

        Cancelling the wait tells the client the request is settled
        (``$/cancel_request``).
        """
        if self.protocol_version == v2.V2:
            if not v2.client_answers(method):
                raise ConnectionError(f"a v2 client has no {method}")  # ask another
            params = v2.client_request(method, params)
        pending = self._pending
        if pending is None:
            pending = self._pending = PendingRequests()
        msg_id, future = pending.open()
        self.send(jsonrpc.request(msg_id, method, params))
        try:
            return await future
        except asyncio.CancelledError:
            self.send(jsonrpc.notification("$/cancel_request", {"requestId": msg_id}))
            raise
        except PeerGone as exc:
            raise ConnectionError(str(exc)) from None
        finally:
            pending.discard(msg_id)

    # -- sessions (see ActiveSessions) ------------------------------------------------------

    @property
    def active(self) -> dict[str, ActiveSession]:
        """The sessions active on this connection, by id."""
        return self.sessions.active

    @active.setter
    def active(self, active: dict[str, ActiveSession]) -> None:
        self.sessions.active = active

    async def activate(
        self, tenant: str, session_id: str, *, replay_after: int | None, replay_now: bool
    ) -> int:
        """See :meth:`~.active.ActiveSessions.activate`; the least recently used idle
        sessions are let go first when the connection has no room (:mod:`.session_lru`)."""
        sessions = self.sessions
        # Each step only when it has work: a coroutine made is a connect's work (resume).
        if session_id in sessions.active:
            await sessions.deactivate(session_id)
        if len(sessions.active) >= self.methods.settings.max_sessions_per_connection:
            await make_room(self, self.methods.log.snapshots)  # the least recently used idle go
        return await sessions.activate(
            tenant, session_id, replay_after=replay_after, replay_now=replay_now
        )

    def prompting(self) -> set[str]:
        """The sessions this client's prompt requests in flight are about."""
        return {
            str(request.params.get("sessionId"))
            for request, _ in self.intake.inflight.values()
            if request.method == "session/prompt"
        }

    async def deactivate(self, session_id: str) -> None:
        await self.sessions.deactivate(session_id)

    def hold(self, session_id: str) -> None:
        """Hold the session's live events back until :meth:`release` (a reply goes first)."""
        self.sessions.hold(session_id)

    def release(self, session_id: str) -> None:
        """Send the events held back while a session was being activated."""
        self.sessions.release(session_id)

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        """A live event (see :meth:`~.active.ActiveSessions.deliver`)."""
        self.sessions.deliver(session_id, event, alone=alone)

    def expect_prompt(self, session_id: str, prompt_id: str) -> asyncio.Future[LogEvent]:
        """A future for the ``prompt`` event ``prompt_id``, once it reaches here."""
        return self.sessions.expect_prompt(session_id, prompt_id)

    def forget_prompt(self, session_id: str, prompt_id: str) -> None:
        self.sessions.forget_prompt(session_id, prompt_id)

    def expect_prompt_end(self, session_id: str, prompt_id: str) -> asyncio.Future[LogEvent]:
        """A future for the ``prompt_end`` event of ``prompt_id``, once it reaches here."""
        return self.sessions.expect_prompt_end(session_id, prompt_id)

    def forget_prompt_end(self, session_id: str, prompt_id: str) -> None:
        self.sessions.forget_prompt_end(session_id, prompt_id)

    async def wait_delivered(self, session_id: str, seq: int, timeout: float = 10.0) -> None:
        """Wait until every event up to ``seq`` of the session has been queued here."""
        await self.sessions.wait_delivered(session_id, seq, timeout)

    @property
    def sees_notices(self) -> bool:
        """Whether this client takes ``notice`` updates (else it gets agent message stand-ins)."""
        return self.sessions.sees_notices

    @property
    def batches_replay(self) -> bool:
        """Whether this client asked for replays in batch arrays (see :mod:`.active`)."""
        return batches_replay(self)
