"""One client connection: the negotiated surface, its active sessions, its outgoing queue.

Frames in are parsed and dispatched (requests run concurrently, since a prompt
runs for long and a cancel must overtake it). Frames out go straight to the
socket while it keeps up; behind a backed-up socket they wait in a bounded
queue, drained by a writer task that exists only while the queue is not empty
(an idle connection costs no task), so a slow client never slows another: past
the bound it is disconnected with :data:`CLOSE_SLOW_CONSUMER`.

Ordering rules live here. While a request that activates a session is being
answered, the session's live events are *held*, so the response precedes them
(``session/new``) or follows a replay and precedes them (``session/load``);
``session/prompt`` answers only once the connection has been sent every event
up to the prompt's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import RedisError
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from ... import fastjson
from ...auth.principal import Principal
from ...config import Settings
from ...failures import describe
from ...ops import metrics, tracing
from ...protocol import capabilities, jsonrpc, v2, v2_render
from ...protocol.jsonrpc import Batch, Invalid, JsonObject, Message, Request, Response, RpcError
from ...protocol.pending import PeerGone, PendingRequests
from ...protocol.render import (
    StoredUpdates,
    client_sees_notices,
    is_notice,
    origin_of,
    session_update_frames,
)
from ...protocol.trace import with_trace
from ...store.events import EventRow, EventType, LogEvent, event_of, events_of
from ...store.failures import rpc_failure
from ...store.log import SessionLog
from ..deadlines import DeadlinePassed, deadline_for, within_deadline
from ..fanout import FanoutHub
from .access import (
    LOGINS_PER_SECOND,
    Access,
    counted_subject,
    in_flight_limit,
    token_rate_limit,
)
from .dispatch import Deferred
from .flow import Pace
from .session_lru import make_room, used
from .session_state import ActiveSession, BatchReplies

log = logging.getLogger(__name__)

CLOSE_SLOW_CONSUMER = 4008
"""Close code for a client that reads too slowly (its outgoing queue overflowed)."""
CLOSE_GOING_AWAY = 1001
"""Close code when the broker shuts down: reconnect (to any node)."""
_TURN_SCAN = 256
"""Events read per step when looking back for the prompt turn a v2 viewer joins in."""
_BURST = 512
"""Frames of a run of events (a replay) written at a time, as they are made."""
BATCHED_REPLAY_META = "acpBroker/batchedReplay"
"""The v2 client capability (``capabilities._meta``) that asks for replays in batches."""
REPLAY_BATCH_CHARS = 64 * 1024
"""The most a replay's batch frame holds (a browser delivers a page one message at a time,
and 10,000 of them cost it more than parsing the same text in 40 arrays)."""


_NO_SPAN = contextlib.nullcontext()
"""The span of a request while nothing traces here (reusable: it holds nothing)."""

AtOnce = Callable[["ClientConnection", Request], Any]
"""A method that answers a request in the step that read it (see :meth:`Dispatcher.at_once`):
its result, or a :class:`Later`."""


@dataclass(frozen=True, slots=True)
class Later:
    """What an :data:`AtOnce` answers when its answer comes in a callback, with no task: a
    store read it sent, bounded in time by a timer of its own (``future``: cancelled when
    the request is, or the connection closes), and ``finish``, which makes the result of the
    done future (raises ``RpcError`` to refuse, :class:`Redispatch` to have the request
    dispatched as any other, with what is left of its deadline)."""

    future: asyncio.Future[Any]
    finish: Callable[[asyncio.Future[Any]], Any]
    in_step: Callable[[asyncio.Future[Any], Callable[[Any], None]], None] | None = None
    """Given the future and its done callback: has that run in the step that reads the
    reply, not on the loop's next turn (see :meth:`~broker.store.raw.RawConnection.in_step`)."""


class Redispatch(Exception):
    """A :class:`Later` could not answer: the request is answered by ``work`` (a coroutine
    function: its result is the request's) in a task, with what is left of its deadline, or
    (None) dispatched as any other."""

    def __init__(self, work: Callable[[], Awaitable[Any]] | None = None) -> None:
        super().__init__()
        self.work = work


class Dispatcher(Protocol):
    """What a connection is given to answer its requests with (the ACP methods).

    The connection knows the methods only through this, so the methods may depend
    on the connection without an import circle.
    """

    settings: Settings
    log: SessionLog
    hub: FanoutHub
    access: Access

    async def dispatch(self, conn: ClientConnection, request: Request) -> Any:
        """The result of ``request``, :data:`~.dispatch.DEFERRED`, or an ``RpcError`` raised."""
        ...

    def at_once(self, conn: ClientConnection, request: Request) -> AtOnce | None:
        """What answers ``request`` of ``conn`` without waiting (its result, or an
        ``RpcError`` raised), if it needs none; None: it is dispatched."""
        ...


class ClientConnection:
    """The broker's side of one WebSocket connection."""

    def __init__(
        self,
        ws: ServerConnection,
        methods: Dispatcher,
        *,
        principal: Principal | None,
        conn_id: str | None = None,
    ) -> None:
        self.ws = ws
        self.id = conn_id or str(ws.id)  # given: the caller had made it already
        # Held, not looked up: on Python 3.11 each lookup of the running loop is a getpid()
        # system call, ten a request before (13% of a front's samples under session/list).
        self._loop = asyncio.get_running_loop()
        self.methods = methods
        self.settings = methods.settings
        self.principal = principal
        self.tenant = principal.tenant if principal else ""
        self.unauthenticated_since: float | None = None if principal else time.monotonic()
        self.pace = Pace(self.settings.rate_per_connection)
        # Made on first use, as the queue below: few connections log in or are asked
        # anything, and every connection made is a connect's work and an idle one's memory.
        self._login_attempts: Pace | None = None
        self.protocol_version: int | None = None
        self.client_capabilities: JsonObject = {}
        self._notices: bool | None = None
        self.active: dict[str, ActiveSession] = {}
        self._pending: PendingRequests | None = None  # the client's answers awaited
        # Made on first use: most connections never queue a frame, and an empty deque is
        # 760 bytes (at 10,000 idle connections, each byte here is 10 KB).
        self._queue: deque[str] | None = None
        self._queued_bytes = 0
        self._writer: asyncio.Task[None] | None = None  # while the queue is not empty
        self._closing = False
        self._idle = False  # whether :meth:`run` waits for a message, none queued (frame_in)
        # Tasks, and reads of :class:`Later` answers, while any runs (a set is 216 B).
        self._tasks: set[asyncio.Future[Any]] | None = None
        self._inflight: dict[jsonrpc.RequestId, tuple[Request, asyncio.Future[Any]]] = {}
        self._batched: dict[jsonrpc.RequestId, BatchReplies] = {}
        self._room: asyncio.Future[None] | None = None  # set when a request in flight ends
        self._corked: list[bytes] = []  # event frames to write once this burst is handed out
        self._cork_list: list[ClientConnection] | None = None  # its event loop's, see _cork_list

    # -- lifecycle --------------------------------------------------------------------------

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
                if isinstance(frame, str):
                    await self._take(frame)
                # An idle connection waits for its next frame here: it does not keep its
                # last one, and what that parsed to, meanwhile (~700 B each).
                del frame
        except ConnectionClosed:
            pass
        finally:
            self._closing = True
            writer = self._writer
            if writer is not None:
                writer.cancel()
            for task in list(self._tasks or ()):
                task.cancel()
            if self._pending is not None:
                self._pending.fail_all("the client disconnected")
            for session in list(self.active.values()):
                await self.methods.hub.leave(session.tenant, session.session_id, self)
            self.active.clear()
            if writer is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await writer

    def frame_in(self, frame: Frame) -> bool:
        """A message's last frame, as websockets parses it (``data_received``): True when it
        was taken in that step, no task woken to read it (a text message that needs no wait,
        while :meth:`run` waits for the next one); False leaves it to websockets' queue and
        :meth:`run`, and every message after it until :meth:`run` reads on (none overtakes
        another)."""
        if self._idle and frame.opcode is Opcode.TEXT and frame.fin:
            try:
                text: str | None = bytes(frame.data).decode()
            except UnicodeDecodeError:  # websockets' queue fails the connection as it does
                text = None
            if text is not None and self._took(text):
                return True
        self._idle = False
        return False

    def _took(self, frame: str) -> bool:
        """:meth:`_take` in this step; False when the pace asks for a wait (nothing done:
        :meth:`run` reads the frame again, and waits)."""
        message = self._receive(frame)
        if message is None:
            return True
        if not self._paced_now(message):
            return False
        self._dispatch(message, None)
        return True

    def _paced_now(self, message: Message | Invalid | Batch) -> bool:
        """:meth:`_pace` when it would not wait (True: counted in); False: nothing counted."""
        requests = _requests_in(message)
        if not requests:
            return True
        if len(self._inflight) + requests > self.settings.max_requests_in_flight:
            return False
        pace = self.pace
        if not pace.take(requests):
            return False
        subject = counted_subject(self.principal)
        if subject and not self.methods.access.rates.take_leased(subject, requests):
            pace.refund(requests)
            return False
        return True

    @property
    def login_attempts(self) -> Pace:
        """The pace of this connection's login attempts (ACP ``authenticate``)."""
        pace = self._login_attempts
        if pace is None:
            pace = self._login_attempts = Pace(LOGINS_PER_SECOND)
        return pace

    async def _take(self, frame: str) -> None:
        """One text frame in: parsed, paced, dispatched."""
        message = self._receive(frame)
        if message is not None:
            # Paced here, before the next frame is read: see :mod:`.flow`.
            refusal = await self._pace(message)
            self._dispatch(message, refusal)

    def cut(self, code: int, reason: str) -> None:
        """Close the connection now: its credential is no longer good (nothing more of it is
        answered; its prompts go on in their agent hosts)."""
        self.principal, self.unauthenticated_since = None, None
        self._spawn(self.ws.close(code, reason))

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for the requests in flight to be answered; a prompt is not waited
        for: it goes on in its agent host, and the client resumes it on another node."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            tasks = [t for r, t in self._inflight.values() if r.method != "session/prompt"]
            left = deadline - loop.time()
            if not tasks or left <= 0:
                return
            await asyncio.wait(tasks, timeout=left)

    def _receive(self, frame: str) -> Message | Invalid | Batch | None:
        """One frame in, parsed; None when it was answered already (or could not be handled:
        a fault in handling a frame never ends the connection)."""
        try:
            return self._parse(frame)
        except Exception:
            log.exception("a frame from %s could not be handled", self.id)
            self.send(jsonrpc.error_reply(None, RpcError(jsonrpc.INTERNAL_ERROR, "internal error")))
            return None

    def _parse(self, frame: str) -> Message | Invalid | Batch | None:
        limit = self.settings.max_message_bytes
        # A character is at most 4 bytes in UTF-8: most frames need no encoding to be sized.
        if len(frame) * 4 > limit and len(frame.encode()) > limit:
            too_big = RpcError(jsonrpc.INVALID_REQUEST, "message too large")
            self.send(jsonrpc.error_reply(None, too_big))
            return None
        depth = self.settings.max_json_depth
        if self.protocol_version == v2.V1:  # batches are v2's (the v1 schema has none)
            return jsonrpc.parse_frame(frame, max_depth=depth, strict_numbers=True)
        return jsonrpc.parse_frame_or_batch(
            frame,
            max_depth=depth,
            max_entries=self.settings.max_batch_entries,
            strict_numbers=True,
        )

    async def _pace(self, message: Message | Invalid | Batch) -> RpcError | None:
        """Wait as long as the frame's requests need (:mod:`.flow`); the error that refuses
        them when the credential's budget has no room within ``max_pace`` seconds."""
        requests = _requests_in(message)
        if not requests:
            return None
        loop = self._loop
        deadline = loop.time() + self.settings.max_pace
        if len(self._inflight) + requests > self.settings.max_requests_in_flight:
            await self._room_in_flight(requests, deadline)
        wait = self.pace.spend(requests)
        if wait > 0:
            await asyncio.sleep(wait)
        subject = counted_subject(self.principal)
        if not subject:
            return None
        rates = self.methods.access.rates
        while True:
            try:
                wait = await rates.take(subject, requests)
            except (RedisError, OSError) as exc:  # the store away: served uncounted
                rates.failures.failed(exc)
                return None
            rates.failures.succeeded()
            if not wait:
                return None
            if loop.time() + wait > deadline:
                return token_rate_limit(self.settings)
            await asyncio.sleep(wait)

    async def _room_in_flight(self, requests: int, deadline: float) -> None:
        """Wait (until ``deadline`` at most) for room for ``requests`` more in flight; past it,
        the ones with no room are refused by :meth:`_on_message`."""
        limit = self.settings.max_requests_in_flight
        loop = self._loop
        while len(self._inflight) + min(requests, limit) > limit:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._room = loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room, left)

    def _dispatch(self, message: Message | Invalid | Batch, refusal: RpcError | None) -> None:
        """Run a parsed frame's requests (or answer each with ``refusal``)."""
        try:
            if refusal is not None:
                message = _refused(message, refusal)
            if isinstance(message, Batch):
                self._on_batch(message)
            else:
                self._on_message(message, None)
        except Exception:
            log.exception("a frame from %s could not be handled", self.id)
            self.send(jsonrpc.error_reply(None, RpcError(jsonrpc.INTERNAL_ERROR, "internal error")))

    def _on_message(self, message: Message | Invalid, batch: BatchReplies | None) -> None:
        if isinstance(message, Invalid):
            if message.reply is not None:
                self._respond(message.reply, batch)
        elif isinstance(message, Response):
            if self._pending is not None:
                self._pending.resolve(message)
        elif message.method == "$/cancel_request":
            self._cancel_request(message.params.get("requestId"))
        elif message.id is not None and message.id in self._inflight:
            duplicate = RpcError(jsonrpc.INVALID_REQUEST, "a request with this id is in flight")
            self._respond(jsonrpc.error_reply(message.id, duplicate), batch)
        elif message.id is not None and len(self._inflight) >= self.settings.max_requests_in_flight:
            self._respond(jsonrpc.error_reply(message.id, in_flight_limit(self.settings)), batch)
        elif batch is None and message.id is not None and self._answered_at_once(message):
            return
        else:
            task = self._spawn(self._handle(message))
            if message.id is not None:
                self._inflight[message.id] = (message, task)
                if batch is not None:
                    self._batched[message.id] = batch
                    batch.tasks.append(task)

    def _on_batch(self, batch: Batch) -> None:
        """Run a batch's entries concurrently; answer them in one array (none: nothing)."""
        collected = BatchReplies()
        for entry in batch.entries:
            self._on_message(entry, collected)
        self._spawn(self._answer_batch(collected))

    async def _answer_batch(self, batch: BatchReplies) -> None:
        await asyncio.gather(*batch.tasks, return_exceptions=True)
        if batch.replies:
            self.send_text(jsonrpc.encode_batch(batch.replies))

    def _respond(self, reply: JsonObject, batch: BatchReplies | None) -> None:
        if batch is not None:
            batch.replies.append(reply)
        else:
            self.send(reply)

    def _cancel_request(self, request_id: Any) -> None:
        """``$/cancel_request``: a prompt is cancelled the ACP way, anything else dropped."""
        if not isinstance(request_id, int | str) or isinstance(request_id, bool):
            return
        inflight = self._inflight.get(request_id)
        if inflight is None:
            return
        request, task = inflight
        if request.method == "session/prompt":
            # The agent ends the turn with stopReason "cancelled" and the prompt answers.
            self._spawn(self.methods.dispatch(self, Request("session/cancel", request.params)))
        else:
            task.cancel()
            cancelled = RpcError(jsonrpc.REQUEST_CANCELLED, "request cancelled")
            self.send(jsonrpc.error_reply(request_id, cancelled))

    def _answered_at_once(self, request: Request) -> bool:
        """Answer ``request`` in this step if it needs no waiting (no task, no deadline: a
        reconnecting client's ``initialize``, a list page this front keeps); False: it must
        be dispatched."""
        answer = self.methods.at_once(self, request)
        if answer is None:
            return False
        started = time.perf_counter()
        try:
            # No span to open (the usual case): not even a null one, nor the params' trace
            # fields looked for (1.3% of an uncached front's samples under session/list).
            traced = tracing.active()
            span = tracing.request_span(request.method, request.params) if traced else _NO_SPAN
            with span:
                result = answer(self, request)
        except Redispatch:
            return False
        except RpcError as exc:
            self.send(jsonrpc.error_reply(request.id, exc))
            outcome = "error"
        else:
            if type(result) is Later:
                self._answer_later(request, result, started)
                return True
            self.reply(request, result)
            outcome = "ok"
        _observe(request.method, outcome, time.perf_counter() - started)
        return True

    def _answer_later(self, request: Request, later: Later, started: float) -> None:
        """Answer ``request`` when ``later``'s read is done, in its callback (in flight until
        then, as a task would be: counted, cancellable, cancelled when the connection ends)."""
        future = later.future
        assert request.id is not None
        self._inflight[request.id] = (request, future)
        self._tie(future)  # untied by _later_done: one done callback, not two
        done = functools.partial(self._later_done, request, later, started)
        future.add_done_callback(done)
        if later.in_step is not None:
            later.in_step(future, done)

    def _later_done(
        self, request: Request, later: Later, started: float, future: asyncio.Future[Any]
    ) -> None:
        self._task_done(future)
        outcome = "error"  # cancelled: by the client (answered then), or the connection's end
        if not future.cancelled():
            try:
                result = later.finish(future)
            except Redispatch as redo:
                left = deadline_for(request.method, self.settings) - (time.perf_counter() - started)
                task = self._spawn(self._handle(request, left, started, redo.work))
                assert request.id is not None
                self._inflight[request.id] = (request, task)
                return
            except Exception as exc:  # answered, not swallowed: the client gets its error
                outcome = self._failed(request, exc)
            else:
                self.reply(request, result)
                outcome = "ok"
        self._ended(request)
        _observe(request.method, outcome, time.perf_counter() - started)

    async def _handle(
        self,
        request: Request,
        seconds: float | None = None,
        started: float | None = None,
        work: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        """Answer ``request`` (by ``work`` when given) within ``seconds`` (its method's
        deadline when None), timed from ``started`` (now when None)."""
        started = time.perf_counter() if started is None else started
        outcome = "error"
        try:
            outcome = await self._answer_now(request, seconds, work)
        finally:
            _observe(request.method, outcome, time.perf_counter() - started)
            self._ended(request)

    def _ended(self, request: Request) -> None:
        """A request is no longer in flight: make room for the next."""
        if request.id is not None:
            self._inflight.pop(request.id, None)
            room = self._room
            if room is not None and not room.done():
                room.set_result(None)

    async def _answer_now(
        self,
        request: Request,
        seconds: float | None = None,
        work: Callable[[], Awaitable[Any]] | None = None,
    ) -> str:
        """Answer ``request``; how it went: ``ok``, ``error`` or ``timeout``."""
        if seconds is None:
            seconds = deadline_for(request.method, self.settings)
        try:
            with tracing.request_span(request.method, request.params) as onward:
                if onward and isinstance(request.params, dict):
                    request.params.update(with_trace(request.params, onward))
                answer = work() if work is not None else self.methods.dispatch(self, request)
                result = await within_deadline(answer, request.method, seconds, self._loop)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._failed(request, exc)
        if not isinstance(result, Deferred):
            self.reply(request, result)
        return "ok"

    def _failed(self, request: Request, exc: Exception) -> str:
        """Tell the client ``request`` failed with ``exc``; how: ``error`` or ``timeout``."""
        if isinstance(exc, RpcError):
            if request.id is not None:
                self.send(jsonrpc.error_reply(request.id, exc))
            return "timeout" if isinstance(exc, DeadlinePassed) else "error"
        failure = rpc_failure(exc)
        if failure is None:
            log.error("handling %s failed: %s", request.method, describe(exc), exc_info=exc)
            failure = RpcError(jsonrpc.INTERNAL_ERROR, "internal error")
        else:
            log.warning("%s failed: %s", request.method, failure.message)
        if request.id is not None:
            self.send(jsonrpc.error_reply(request.id, failure))
        return "error"

    # -- outgoing ---------------------------------------------------------------------------

    def reply(self, request: Request, result: Any) -> None:
        """Answer a request now (handlers that must order the reply use this, then DEFERRED)."""
        if request.id is not None:
            if self.protocol_version == v2.V2:
                result = v2.result(request.method, result)
            if type(result) is fastjson.Fragment and request.id not in self._batched:
                text = result.text
                if isinstance(text, bytes):
                    self._send_encoded(jsonrpc.encode_result_parts(request.id, text))
                else:
                    self.send_text(jsonrpc.encode_result(request.id, text))
            else:
                self.send(jsonrpc.result_reply(request.id, result))

    def send(self, message: JsonObject) -> None:
        """Queue one message; a reply to a request of a batch joins the batch's array."""
        msg_id = message.get("id") if "method" not in message else None
        batch = self._batched.pop(msg_id, None) if msg_id is not None else None
        if batch is not None:
            batch.replies.append(message)
        else:
            self.send_text(jsonrpc.encode(message))

    def send_text(self, text: str, *, shared: bool = False, alone: bool = False) -> None:
        """Send one frame: at once while the socket keeps up, else through the bounded queue;
        a client that lets the queue overflow is cut off. ``shared``: an event's frame, which
        many connections are sent (its wire bytes are made once, see :func:`_wire`);
        ``alone``: no other event frame follows it in this step of the event loop, so it is
        written at once rather than gathered (see :meth:`_write_now`)."""
        if self._closing:
            return
        metrics.FRAMES_SENT.inc()
        metrics.BYTES_SENT.inc(len(text))
        queue = self._queue
        if not queue and self._write_now(text, shared, alone):
            return
        if queue is None:
            queue = self._queue = deque()
        queue.append(text)
        self._queued_bytes += len(text)
        if self._queued_bytes > self.settings.max_queue_bytes:
            self._closing = True
            queue.clear()
            log.warning("connection %s is too slow; disconnecting it", self.id)
            metrics.CLOSES.labels("slow_consumer").inc()
            self._spawn(self.ws.close(CLOSE_SLOW_CONSUMER, "slow consumer: outgoing queue full"))
            return
        if self._writer is None:
            self._writer = self._loop.create_task(self._write_queue(queue))

    def _send_encoded(self, parts: tuple[bytes, ...]) -> None:
        """Send one frame whose text is ``parts`` in UTF-8 (a reply spliced around a list
        page as it was read): framed with them in one copy and written at once while the
        socket keeps up, else queued as any frame."""
        if not self._writes_directly():
            self.send_text(b"".join(parts).decode())
            return
        size = sum(map(len, parts))
        metrics.FRAMES_SENT.inc()
        metrics.BYTES_SENT.inc(size)
        self._uncork()  # what was written before goes first
        self.ws.transport.write(b"".join((_frame_head(size), *parts)))

    def _writes_directly(self) -> bool:
        """Whether frames may go straight to the socket (:meth:`_write_texts`): nothing
        queued before them, the socket keeps up, and no extension rewrites frames."""
        ws = self.ws
        return not (
            self._closing
            or self._queue
            or ws.paused
            or ws.send_in_progress is not None
            or ws.protocol.state is not State.OPEN
            or ws.protocol.extensions
        )

    def _write_texts(self, texts: list[str]) -> None:
        """Write event frames now, in one system call, after the frames corked before them
        (the caller checked :meth:`_writes_directly`). Frames of one connection (a replay)
        are not kept for others (see :func:`_wire`)."""
        if not texts or self.ws.protocol.state is not State.OPEN:
            return
        metrics.FRAMES_SENT.inc(len(texts))
        metrics.BYTES_SENT.inc(sum(map(len, texts)))
        try:
            data = b"".join([_framed(text.encode()) for text in texts])
        except UnicodeEncodeError:  # a lone surrogate somewhere: each frame on its own
            data = b"".join(_framed_or_dropped(text, self.id) for text in texts)
        self._uncork()
        self.ws.transport.write(data)

    def _cork(self) -> None:
        """Have the frames gathered in :attr:`_corked` written once this step's work is done
        (one callback writes every connection's, see :func:`_uncork_all`)."""
        if not self._corked:
            corked = self._cork_list
            if corked is None:
                corked = _cork_list(self)
            if not corked:
                self._loop.call_soon(_uncork_all, corked)
            corked.append(self)

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
                if alone and not self._corked:
                    ws.transport.write(_wire(text))
                    return True
                self._cork()
                self._corked.append(_wire(text))
                return True
            data = text.encode()
        except UnicodeEncodeError:
            log.exception("could not send a frame to %s; dropped it", self.id)
            return True
        self._uncork()  # what was written before goes first
        if ws.protocol.extensions:
            ws.protocol.send_text(data)
            ws.send_data()
        else:  # framed here, as the event frames are: websockets' framing is Python too
            ws.transport.write(_framed(data))
        return True

    def _uncork(self) -> None:
        """Write the event frames gathered since the event loop last ran, in one write."""
        corked = self._corked
        if not corked:
            return
        data = corked[0] if len(corked) == 1 else b"".join(corked)
        corked.clear()
        if self.ws.protocol.state is State.OPEN:
            self.ws.transport.write(data)

    async def _write_queue(self, queue: deque[str]) -> None:
        """Send the queued frames in order, then end (the next queued frame starts another)."""
        try:
            while queue:
                text = queue.popleft()
                self._queued_bytes -= len(text)
                self._uncork()
                try:
                    await self.ws.send(text)
                except ConnectionClosed:
                    self._closing = True
                    queue.clear()
                    return
                except (TypeError, ValueError):
                    log.exception("could not send a frame to %s; dropped it", self.id)
        finally:
            self._writer = None

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

    # -- sessions ---------------------------------------------------------------------------

    async def activate(
        self, tenant: str, session_id: str, *, replay_after: int | None, replay_now: bool
    ) -> None:
        """Make a session active here and hold its live events until :meth:`release`.

        ``replay_after`` None: send only what comes next. Otherwise send every
        event after that seq, now (``replay_now``, for load) or on release.
        """
        await self.deactivate(session_id)
        await make_room(self, self.methods.log.snapshots)  # the least recently used idle go
        session = ActiveSession(tenant, session_id, held=[])
        used(session)
        self.active[session_id] = session
        try:
            head = await self.methods.hub.join(tenant, session_id, self)
        except BaseException:
            self.active.pop(session_id, None)
            raise
        if replay_after is None or replay_after >= head:
            session.delivered = head
            session.turn = await self._join_turn(session, head, announce=True)
            return
        epoch, rows = await self.methods.log.read_rows(
            tenant, session_id, after=replay_after, until=head
        )
        if not rows or rows[0][0] != replay_after + 1:
            await self.deactivate(session_id)
            raise jsonrpc.invalid_params("the position is no longer in the session's log")
        session.delivered = replay_after
        session.turn = await self._join_turn(session, replay_after, announce=False)
        if replay_now:
            self._replay(session, epoch, rows)
        else:
            assert session.held is not None
            session.held[:0] = events_of(rows, epoch)

    async def _join_turn(self, session: ActiveSession, seq: int, *, announce: bool) -> int | None:
        """The prompt turn open after event ``seq``, which a v2 viewer's message ids need.

        ``announce``: a viewer that joins within a turn with no replay is told the turn's
        state first (``state_update`` ``running``, or ``requires_action``), since the event
        that said so came before what it is sent. (One that resumes from a position saw it.)
        """
        if self.protocol_version != v2.V2:
            return None
        until, state = seq, None
        while until > 0:
            after = max(0, until - _TURN_SCAN)
            events = await self.methods.log.read(
                session.tenant, session.session_id, after=after, until=until
            )
            found, turn, state = v2_render.turn_state(events, state)
            if found:
                if state is not None and announce:
                    update = v2_render.state_update(state)
                    params = {"sessionId": session.session_id, "update": update}
                    self.send(jsonrpc.notification("session/update", params))
                return turn
            until = after
        return None

    def prompting(self) -> set[str]:
        """The sessions this client's prompt requests in flight are about."""
        return {
            str(request.params.get("sessionId"))
            for request, _ in self._inflight.values()
            if request.method == "session/prompt"
        }

    def hold(self, session_id: str) -> None:
        """Hold the session's live events back until :meth:`release` (a reply goes first)."""
        session = self.active.get(session_id)
        if session is not None and session.held is None:
            session.held = []

    def expect_prompt(self, session_id: str, prompt_id: str) -> asyncio.Future[LogEvent]:
        """A future for the ``prompt`` event ``prompt_id``, once it reaches here."""
        future: asyncio.Future[LogEvent] = self._loop.create_future()
        session = self.active.get(session_id)
        if session is not None:
            session.prompts[prompt_id] = future
        return future

    def forget_prompt(self, session_id: str, prompt_id: str) -> None:
        session = self.active.get(session_id)
        if session is not None:
            session.prompts.pop(prompt_id, None)

    def expect_prompt_end(self, session_id: str, prompt_id: str) -> asyncio.Future[LogEvent]:
        """A future for the ``prompt_end`` event of ``prompt_id``, once it reaches here."""
        future: asyncio.Future[LogEvent] = self._loop.create_future()
        session = self.active.get(session_id)
        if session is not None:
            session.prompt_ends = session.prompt_ends or {}
            session.prompt_ends[prompt_id] = future
        return future

    def forget_prompt_end(self, session_id: str, prompt_id: str) -> None:
        session = self.active.get(session_id)
        if session is not None and session.prompt_ends is not None:
            session.prompt_ends.pop(prompt_id, None)

    def release(self, session_id: str) -> None:
        """Send the events held back while a session was being activated."""
        session = self.active.get(session_id)
        if session is None or session.held is None:
            return
        held, session.held = session.held, None
        held.sort(key=lambda e: e.seq)
        self._emit_many(session, held, replay=False)

    async def deactivate(self, session_id: str) -> None:
        session = self.active.pop(session_id, None)
        if session is not None:
            for _, waiter in session.waiters:
                if not waiter.done():
                    waiter.set_result(None)
            await self.methods.hub.leave(session.tenant, session_id, self)

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        """A live event from the hub; ``alone``: the only one it hands out in this step."""
        session = self.active.get(session_id)
        if session is None:
            return
        if session.prompts and event.type == EventType.PROMPT:
            accepted = session.prompts.pop(str(event.body.get("promptId")), None)
            if accepted is not None and not accepted.done():
                accepted.set_result(event)
        if session.prompt_ends and event.type == EventType.PROMPT_END:
            ended = session.prompt_ends.pop(str(event.body.get("promptId")), None)
            if ended is not None and not ended.done():
                ended.set_result(event)
        if session.held is not None:
            session.held.append(event)
        else:
            self._emit(session, event, replay=False, alone=alone)

    async def wait_delivered(self, session_id: str, seq: int, timeout: float = 10.0) -> None:
        """Wait until every event up to ``seq`` of the session has been queued here."""
        session = self.active.get(session_id)
        if session is None or session.delivered >= seq:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        session.waiters.append((seq, future))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, timeout)

    def _emit(
        self, session: ActiveSession, event: LogEvent, *, replay: bool, alone: bool = False
    ) -> None:
        for text in self._delivered(session, event, replay=replay):
            self.send_text(text, shared=True, alone=alone)

    def _replay(self, session: ActiveSession, epoch: str, rows: list[EventRow]) -> None:
        """Send a session's history (rows of log ``epoch``): a frame per message, or, to a
        client that asked for them (:attr:`batches_replay`), the same messages in order in
        batch arrays."""
        texts = self._replayed(session, epoch, rows)
        if not self.batches_replay:
            self._send_events(texts)
            return
        # As :meth:`_send_events` writes a replay: each batch as soon as it is made (the
        # client reads the first while the rest are made), straight to the transport whatever
        # its buffer holds, so that a long history never meets the queue's bound for live
        # traffic.
        direct = self._writes_directly()
        for frame in jsonrpc.pack_batches(texts, REPLAY_BATCH_CHARS):
            if direct:
                self._write_texts([frame])
            else:
                self.send_text(frame)

    def _replayed(self, session: ActiveSession, epoch: str, rows: list[EventRow]) -> Iterator[str]:
        """The frames of a replay, in order, as :meth:`_delivered` makes them of each event:
        a plain update's (most of a history) straight from its stored text, for a v1 client
        (:class:`StoredUpdates`) or, a message chunk, for a v2 one (:class:`StoredChunks`);
        any other from the event parsed."""
        v2_chunks = self.protocol_version == v2.V2
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
            self._wake_waiters(session)  # they resume once this step has sent the frames
        return True

    def _delivered(self, session: ActiveSession, event: LogEvent, *, replay: bool) -> list[str]:
        """Count ``event`` as delivered here and return its frames to send at once (none
        when it was delivered before)."""
        if not self._count(session, event.seq):
            return []
        frames = self._frames(session, event, replay=replay)
        if event.type == EventType.DELETED:
            self._spawn(self.deactivate(session.session_id))
        return frames

    def _emit_many(self, session: ActiveSession, events: list[LogEvent], *, replay: bool) -> None:
        """Events in order, as :meth:`_emit` sends each, their frames written together (see
        :meth:`_send_events`)."""
        self._send_events(
            t for event in events for t in self._delivered(session, event, replay=replay)
        )

    def _send_events(self, texts: Iterable[str]) -> None:
        """Event frames in order, written together, a burst at a time, as soon as each is
        made (a replay of 10,000 events: the client reads the first frames while the rest
        are made, not once all are); through the queue when the socket is backed up."""
        if not self._writes_directly():
            for text in list(texts):
                self.send_text(text, shared=True)
            return
        burst: list[str] = []
        for text in texts:
            burst.append(text)
            if len(burst) >= _BURST:
                self._write_texts(burst)
                burst = []
        self._write_texts(burst)

    def _frames(self, session: ActiveSession, event: LogEvent, *, replay: bool) -> list[str]:
        """What this connection is sent for an event, in its protocol version."""
        notices = self.sees_notices
        if self.protocol_version == v2.V2:
            turn, session.turn = session.turn, v2_render.next_turn(event, session.turn)
            if replay and is_notice(event):
                return []  # notices are live only (the notices RFD)
            return _v2_frames(event, session.session_id, turn)
        if replay and notices and is_notice(event):
            return []
        # v1: the window that typed a prompt does not get it echoed back (live).
        own_prompt = not replay and event.type == EventType.PROMPT and origin_of(event) == self.id
        return [] if own_prompt else _frames(event, session.session_id, notices)

    @property
    def sees_notices(self) -> bool:
        """Whether this client takes ``notice`` updates (else it gets agent message stand-ins)."""
        if self._notices is None:
            if self.protocol_version is None:
                return False
            self._notices = client_sees_notices(self.protocol_version, self.client_capabilities)
        return self._notices

    @property
    def batches_replay(self) -> bool:
        """Whether this client asked at ``initialize`` for replays in JSON-RPC batch arrays
        (``capabilities._meta["acpBroker/batchedReplay"]: true``; ACP v2 only, whose
        transports follow JSON-RPC's batch rules). Every other client gets one per frame."""
        if self.protocol_version != v2.V2:
            return False
        return capabilities.opted_in(self.client_capabilities, BATCHED_REPLAY_META)

    @staticmethod
    def _wake_waiters(session: ActiveSession) -> None:
        still = []
        for seq, future in session.waiters:
            if seq <= session.delivered:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((seq, future))
        session.waiters = still

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro, loop=self._loop)
        self._hold(task)
        return task

    def _hold(self, work: asyncio.Future[Any]) -> None:
        """Tie ``work`` (a task, a read) to the connection's life: cancelled at its end."""
        self._tie(work)
        work.add_done_callback(self._task_done)

    def _tie(self, work: asyncio.Future[Any]) -> None:
        """:meth:`_hold` for work whose own done callback calls :meth:`_task_done`."""
        if self._tasks is None:
            self._tasks = set()
        self._tasks.add(work)

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        tasks = self._tasks
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                self._tasks = None

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run work tied to this connection's life."""
        return self._spawn(coro)


def _refused(message: Message | Invalid | Batch, error: RpcError) -> Message | Invalid | Batch:
    """The frame with each of its requests replaced by ``error`` (answers to this side's
    requests go through: they are not paced)."""
    if isinstance(message, Batch):
        return Batch(tuple(_refused_entry(entry, error) for entry in message.entries))
    return _refused_entry(message, error)


def _refused_entry(entry: Message | Invalid, error: RpcError) -> Message | Invalid:
    if not isinstance(entry, Request):
        return entry
    return Invalid(jsonrpc.error_reply(entry.id, error) if entry.id is not None else None)


_CORKED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[ClientConnection]] = (
    weakref.WeakKeyDictionary()
)


def _cork_list(conn: ClientConnection) -> list[ClientConnection]:
    """The connections of this event loop with frames gathered in the current step: one
    callback (:func:`_uncork_all`) writes them all, not one callback per connection."""
    loop = conn._loop
    corked = _CORKED.get(loop)
    if corked is None:
        corked = _CORKED[loop] = []
    conn._cork_list = corked
    return corked


def _uncork_all(corked: list[ClientConnection]) -> None:
    conns = corked[:]
    corked.clear()
    for conn in conns:
        conn._uncork()


_WIRE: dict[str, bytes] = {}
_WIRE_ENTRIES = 4096
_WIRE_LARGEST = 64 * 1024


def _wire(text: str) -> bytes:
    """A text frame as this server puts it on the wire (FIN, unmasked, no extensions).

    Kept for the last few thousand event frames, so an event going to a thousand
    connections is encoded and framed once (the text's hash is computed once too).
    """
    wire = _WIRE.get(text)
    if wire is None:
        wire = _framed(text.encode())
        if len(wire) <= _WIRE_LARGEST:
            if len(_WIRE) >= _WIRE_ENTRIES:
                _WIRE.clear()
            _WIRE[text] = wire
    return wire


def _requests_in(message: Message | Invalid | Batch) -> int:
    """How many requests a frame carries (what its pace counts)."""
    if isinstance(message, Request):  # most frames: no entries to walk
        return 1
    if isinstance(message, Batch):
        return sum(1 for entry in message.entries if isinstance(entry, Request))
    return 0


def _observe(method: str, outcome: str, elapsed: float) -> None:
    """A request's time in its histograms."""
    for series in _series_of(metrics.method_label(method), outcome):
        series.observe(elapsed)


@functools.lru_cache(maxsize=256)
def _series_of(label: str, outcome: str) -> tuple[metrics.Series, ...]:
    """The histograms a request of the method labelled ``label`` ending so is timed in,
    looked up once (not three lookups a request: ~1% of an uncached front's samples under
    ``session/list``). Keyed by the label, not the method a client named: the cache holds
    no client's text."""
    series = [metrics.request_seconds(label, outcome)]
    if label == "session/list":
        series.append(metrics.list_seconds("acp"))
    return tuple(series)


def _framed(data: bytes) -> bytes:
    """A text frame's payload as this server puts it on the wire (FIN, unmasked, no
    extensions)."""
    return _frame_head(len(data)) + data


def _frame_head(size: int) -> bytes:
    """The header of a text frame of ``size`` bytes as :func:`_framed` makes it."""
    if size < 126:
        return bytes((0x81, size))
    if size < 65536:
        return b"\x81\x7e" + size.to_bytes(2, "big")
    return b"\x81\x7f" + size.to_bytes(8, "big")


def _framed_or_dropped(text: str, conn_id: str) -> bytes:
    try:
        return _framed(text.encode())
    except UnicodeEncodeError:
        log.exception("could not send a frame to %s; dropped it", conn_id)
        return b""


def _frames(event: LogEvent, session_id: str, notices: bool) -> list[str]:
    """The v1 frames of an event, serialized once and shared by every v1 viewer (of a notice:
    by those that take notices, and apart by those that do not)."""
    notices = notices and is_notice(event)
    key = "v1:notices" if notices else "v1"
    frames = event.frames.get(key)
    if frames is None:
        frames = session_update_frames(event, session_id, notices)
        event.frames[key] = frames
    return frames


def _v2_frames(event: LogEvent, session_id: str, turn: int | None) -> list[str]:
    """The v2 frames of an event in a turn, serialized once and shared by every v2 viewer."""
    key = v2_render.frame_key(turn)
    frames = event.frames.get(key)
    if frames is None:
        frames = [jsonrpc.encode(m) for m in v2_render.session_updates(event, session_id, turn)]
        event.frames[key] = frames
    return frames
