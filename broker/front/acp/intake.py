"""One connection's requests: parsed, paced, in flight, answered (no socket here).

Frames in are parsed and dispatched (requests run concurrently, since a prompt runs for
long and a cancel must overtake it). A frame's requests are paced where it is read (see
:mod:`.flow`): the connection waits in :meth:`Intake.take_frame` before it reads its next
frame. A request is answered in one of the ways :mod:`.dispatch` names, all settled in
:meth:`Intake._settle`; its answer goes out through the connection's
:class:`~.outbox.Outbox`, or, a request of a batch, into the batch's one array.

The intake knows its connection only through :class:`Owner` and its methods through
:class:`Dispatcher`: its tests feed it frames and read what its outbox was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from ... import fastjson
from ...auth.principal import Principal
from ...config import Settings
from ...errors.failures import describe
from ...errors.store import rpc_failure
from ...ops import metrics, tracing
from ...protocol import jsonrpc, v2
from ...protocol.jsonrpc import Batch, Invalid, JsonObject, Message, Request, Response, RpcError
from ...protocol.trace import with_trace
from ..deadlines import DeadlinePassed, deadline_for, within_deadline
from .access import Access, in_flight_limit, waiting_limit
from .dispatch import Deferred, InTask, PendingRead, StepAnswer
from .flow import Pace
from .pacing import FramePacer
from .session_state import BatchReplies

if TYPE_CHECKING:
    from .lifetime import Lifetime
    from .outbox import Outbox

log = logging.getLogger(__name__)

_NO_SPAN = contextlib.nullcontext()
"""The span of a request while nothing traces here (reusable: it holds nothing)."""


class Dispatcher(Protocol):
    """What a connection is given to answer its requests with (the ACP methods).

    The connection knows the methods only through this, so the methods may depend
    on the connection without an import circle.
    """

    settings: Settings
    access: Access

    async def dispatch(self, conn: Any, request: Request) -> Any:
        """The result of ``request``, :data:`~.dispatch.DEFERRED`, or an ``RpcError`` raised."""
        ...

    def at_once(self, conn: Any, request: Request) -> StepAnswer | None:
        """What answers ``request`` of ``conn`` in the step that read it, if anything may;
        None: it is dispatched in a task."""
        ...


class Owner(Protocol):
    """What the intake reads of its connection."""

    id: str
    principal: Principal | None
    protocol_version: int | None
    pace: Pace

    def answers_for_client(self, message: Response) -> None:
        """An answer to one of this side's requests to the client."""
        ...

    def reading_held(self, held: bool) -> None:
        """Pacing holds (True) or stops holding (False) the connection's reading back."""
        ...


class Intake(FramePacer):
    """The requests of one connection, from the frame that carries them to their answers."""

    __slots__ = (
        "_batched",
        "_lifetime",
        "_loop",
        "_methods",
        "_outbox",
        "_owner",
        "_settings",
        "inflight",
    )
    _methods: Dispatcher  # pacing reads it as its Budgets

    def __init__(
        self,
        owner: Callable[[], Owner | None],
        methods: Dispatcher,
        outbox: Outbox,
        lifetime: Lifetime,
        loop: asyncio.AbstractEventLoop,
        holds: bool = False,
    ) -> None:
        # Weakly: the connection holds this part; no cycle for the collector to find.
        self._owner = owner
        self._methods = methods
        self._settings = methods.settings
        self._outbox = outbox
        self._lifetime = lifetime
        self._loop = loop
        self.inflight: dict[jsonrpc.RequestId, tuple[Request, asyncio.Future[Any]]] = {}
        # A batch's requests, by id, while any is in flight (few clients send batches).
        self._batched: dict[jsonrpc.RequestId, BatchReplies] | None = None
        super().__init__(holds)

    @property
    def _conn(self) -> Owner:
        conn = self._owner()
        assert conn is not None  # the connection outlives its parts' work (cancelled at its end)
        return conn

    # -- frames in ------------------------------------------------------------------------

    async def take_frame(self, frame: str) -> None:
        """One text frame in: parsed, paced (waiting as long as the pace asks), dispatched."""
        message = self._receive(frame)
        if message is not None:
            # Paced here, before the next frame is read: see :mod:`.flow`.
            refusal = await self.pace(message)
            self._dispatch(message, refusal)

    def take_frame_now(self, frame: str) -> bool:
        """:meth:`take_frame` in this step; False when the pace asks for a wait (nothing done:
        the connection reads the frame again, and waits)."""
        message = self._receive(frame)
        if message is None:
            return True
        if not self.paced_now(message):
            return False
        self._dispatch(message, None)
        return True

    def refuse_frame_now(self, frame: str) -> bool:
        """A frame read while more wait for the pace than it serves within ``max_pace`` (see
        :mod:`.flow`): its requests refused in this step (True); False for a frame that holds
        anything else (nothing done: it waits its turn)."""
        message = self._receive(frame)
        if message is None:
            return True
        entries = message.entries if isinstance(message, Batch) else (message,)
        # Only requests can be refused: a notification (a cancel) or an answer must not be
        # dropped unsaid, so a frame holding one waits its turn, whole.
        if not all(type(entry) is Request and entry.id is not None for entry in entries):
            return False
        self._dispatch(message, waiting_limit(self._settings))
        return True

    def _receive(self, frame: str) -> Message | Invalid | Batch | None:
        """One frame in, parsed; None when it was answered already (or could not be handled:
        a fault in handling a frame never ends the connection)."""
        try:
            return self._parse(frame)
        except Exception:
            log.exception("a frame from %s could not be handled", self._conn.id)
            self.send(jsonrpc.error_reply(None, RpcError(jsonrpc.INTERNAL_ERROR, "internal error")))
            return None

    def _parse(self, frame: str) -> Message | Invalid | Batch | None:
        limit = self._settings.max_message_bytes
        # A character is at most 4 bytes in UTF-8: most frames need no encoding to be sized.
        if len(frame) * 4 > limit and len(frame.encode()) > limit:
            too_big = RpcError(jsonrpc.INVALID_REQUEST, "message too large")
            self.send(jsonrpc.error_reply(None, too_big))
            return None
        depth = self._settings.max_json_depth
        conn = self._owner()  # not :attr:`_conn`: a call less for each message
        assert conn is not None
        if conn.protocol_version == v2.V1:  # batches are v2's (the v1 schema has none)
            return jsonrpc.parse_frame(frame, max_depth=depth, strict_numbers=True)
        return jsonrpc.parse_frame_or_batch(
            frame,
            max_depth=depth,
            max_entries=self._settings.max_batch_entries,
            strict_numbers=True,
        )

    # -- dispatch ---------------------------------------------------------------------------

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
            log.exception("a frame from %s could not be handled", self._conn.id)
            self.send(jsonrpc.error_reply(None, RpcError(jsonrpc.INTERNAL_ERROR, "internal error")))

    def _on_message(self, message: Message | Invalid, batch: BatchReplies | None) -> None:
        if isinstance(message, Invalid):
            if message.reply is not None:
                self._respond(message.reply, batch)
        elif isinstance(message, Response):
            self._conn.answers_for_client(message)
        elif message.method == "$/cancel_request":
            self._cancel_request(message.params.get("requestId"))
        elif message.id is not None and message.id in self.inflight:
            duplicate = RpcError(jsonrpc.INVALID_REQUEST, "a request with this id is in flight")
            self._respond(jsonrpc.error_reply(message.id, duplicate), batch)
        elif message.id is not None and len(self.inflight) >= self._settings.max_requests_in_flight:
            self._respond(jsonrpc.error_reply(message.id, in_flight_limit(self._settings)), batch)
        else:
            self._start(message, batch)

    def _on_batch(self, batch: Batch) -> None:
        """Run a batch's entries concurrently; answer them in one array (none: nothing)."""
        collected = BatchReplies()
        for entry in batch.entries:
            self._on_message(entry, collected)
        self._lifetime.spawn(self._answer_batch(collected))

    async def _answer_batch(self, batch: BatchReplies) -> None:
        await asyncio.gather(*batch.tasks, return_exceptions=True)
        if batch.replies:
            self._outbox.send_text(jsonrpc.encode_batch(batch.replies))

    def _respond(self, reply: JsonObject, batch: BatchReplies | None) -> None:
        if batch is not None:
            batch.replies.append(reply)
        else:
            self.send(reply)

    def _cancel_request(self, request_id: Any) -> None:
        """``$/cancel_request``: a prompt is cancelled the ACP way, anything else dropped."""
        if not isinstance(request_id, int | str) or isinstance(request_id, bool):
            return
        inflight = self.inflight.get(request_id)
        if inflight is None:
            return
        request, task = inflight
        if request.method == "session/prompt":
            # The agent ends the turn with stopReason "cancelled" and the prompt answers.
            cancel = Request("session/cancel", request.params)
            self._lifetime.spawn(self._methods.dispatch(self._conn, cancel))
        else:
            task.cancel()
            cancelled = RpcError(jsonrpc.REQUEST_CANCELLED, "request cancelled")
            self.send(jsonrpc.error_reply(request_id, cancelled))

    # -- answering: one mechanism -----------------------------------------------------------

    def _start(self, request: Request, batch: BatchReplies | None) -> None:
        """Answer ``request``: in this step when its method may (a single request with an
        id: no batch array waits on it), else in a task."""
        answer = None
        conn = self._owner()
        assert conn is not None
        if batch is None and request.id is not None:
            answer = self._methods.at_once(conn, request)
        if answer is None:
            self._in_task(request, batch)
            return
        started = time.perf_counter()
        try:
            # No span to open (the usual case): not even a null one, nor the params' trace
            # fields looked for (1.3% of an uncached front's samples under session/list).
            traced = tracing.active()
            span = tracing.request_span(request.method, request.params) if traced else _NO_SPAN
            with span:
                outcome = answer(conn, request)
        except Exception as exc:  # answered, not swallowed: the client gets its error
            observe(request.method, self._failed(request, exc), time.perf_counter() - started)
            return
        self._settle(request, outcome, started)

    def _settle(self, request: Request, outcome: Any, started: float) -> None:
        """Act on what answers ``request`` (see :mod:`.dispatch`): a read to wait for, a task
        to run with what is left of its deadline, or the result, sent now."""
        kind = type(outcome)
        if kind is PendingRead:
            self._await_read(request, outcome, started)
        elif kind is InTask:
            left = deadline_for(request.method, self._settings) - (time.perf_counter() - started)
            self._in_task(request, None, left, started, outcome.work)
        else:
            self.reply(request, outcome)
            observe(request.method, "ok", time.perf_counter() - started)

    def _in_task(
        self,
        request: Request,
        batch: BatchReplies | None,
        seconds: float | None = None,
        started: float | None = None,
        work: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        task = self._lifetime.spawn(self._handle(request, seconds, started, work))
        if request.id is not None:
            self.inflight[request.id] = (request, task)
            if batch is not None:
                if self._batched is None:
                    self._batched = {}
                self._batched[request.id] = batch
                batch.tasks.append(task)

    def _await_read(self, request: Request, read: PendingRead, started: float) -> None:
        """Answer ``request`` when ``read`` is done, in its callback (in flight until then, as
        a task would be: counted, cancellable, cancelled when the connection ends)."""
        future = read.future
        assert request.id is not None
        self.inflight[request.id] = (request, future)
        self._lifetime.add(future)  # removed by _read_done: one done callback, not two
        done = functools.partial(self._read_done, request, read, started)
        future.add_done_callback(done)
        if read.in_step is not None:
            read.in_step(future, done)

    def _read_done(
        self, request: Request, read: PendingRead, started: float, future: asyncio.Future[Any]
    ) -> None:
        self._lifetime.done(future)
        self._ended(request)
        if future.cancelled():  # by the client (answered then), or the connection's end
            observe(request.method, "error", time.perf_counter() - started)
            return
        try:
            outcome = read.finish(future)
        except Exception as exc:  # answered, not swallowed: the client gets its error
            observe(request.method, self._failed(request, exc), time.perf_counter() - started)
            return
        self._settle(request, outcome, started)

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
            observe(request.method, outcome, time.perf_counter() - started)
            self._ended(request)

    def _ended(self, request: Request) -> None:
        """A request is no longer in flight: make room for the next."""
        if request.id is not None:
            inflight = self.inflight
            inflight.pop(request.id, None)
            if not inflight:
                # An emptied dict keeps its table (160 B); cleared, it has none: an idle
                # connection has none in flight.
                inflight.clear()
            self.room_made()

    async def _answer_now(
        self,
        request: Request,
        seconds: float | None = None,
        work: Callable[[], Awaitable[Any]] | None = None,
    ) -> str:
        """Answer ``request``; how it went: ``ok``, ``error`` or ``timeout``."""
        if seconds is None:
            seconds = deadline_for(request.method, self._settings)
        try:
            with tracing.request_span(request.method, request.params) as onward:
                if onward and isinstance(request.params, dict):
                    request.params.update(with_trace(request.params, onward))
                if work is not None:
                    answer = work()
                else:
                    conn = self._owner()
                    assert conn is not None
                    answer = self._methods.dispatch(conn, request)
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

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for the requests in flight to be answered; a prompt is not waited
        for: it goes on in its agent host, and the client resumes it on another node."""
        loop = self._loop
        deadline = loop.time() + timeout
        while True:
            tasks = [t for r, t in self.inflight.values() if r.method != "session/prompt"]
            left = deadline - loop.time()
            if not tasks or left <= 0:
                return
            await asyncio.wait(tasks, timeout=left)

    # -- answers out ------------------------------------------------------------------------

    def reply(self, request: Request, result: Any) -> None:
        """Answer a request now (handlers that must order the reply use this, then DEFERRED)."""
        if request.id is not None:
            conn = self._owner()
            assert conn is not None
            if conn.protocol_version == v2.V2:
                result = v2.result(request.method, result)
            batched = self._batched
            if type(result) is fastjson.Fragment and not (batched and request.id in batched):
                text = result.text
                if isinstance(text, bytes):
                    self._outbox.send_encoded(jsonrpc.encode_result_parts(request.id, text))
                else:
                    self._outbox.send_text(jsonrpc.encode_result(request.id, text))
            else:
                self.send(jsonrpc.result_reply(request.id, result))

    def send(self, message: JsonObject) -> None:
        """Queue one message; a reply to a request of a batch joins the batch's array."""
        batched = self._batched
        msg_id = message.get("id") if batched is not None and "method" not in message else None
        if msg_id is not None:
            assert batched is not None
            batch = batched.pop(msg_id, None)
            if batch is not None:
                if not batched:
                    self._batched = None
                batch.replies.append(message)
                return
        self._outbox.send_text(jsonrpc.encode(message))


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


def observe(method: str, outcome: str, elapsed: float) -> None:
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
