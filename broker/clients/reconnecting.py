"""The stdio bridge's relay, which outlives the connection it started on.

Editor lines are read into a queue as they come; while a connection is up they are noted
(:class:`.resume.BridgeState`) and sent. When the connection drops in a way that calls for
another (:data:`.link.RECONNECT_CODES`), the bridge connects again (:class:`.backoff.Backoff`,
:class:`.backoff.UrlRing`), sends the editor's ``initialize`` again, resumes every session
that was active from the last update forwarded, settles the requests that were in flight,
and only then sends what the editor wrote meanwhile. The editor sees a delay; stderr gets
one line per outage. Past the backoff's bound the bridge gives up (exit 1).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from ..protocol.jsonrpc import JsonObject
from .backoff import Backoff, UrlRing
from .link import Link, LinkLost, describe_close
from .output import frame_to_line, report
from .resume import BridgeState, RecoveryKind

__all__ = ["DRAIN_AFTER_CLOSE_SECONDS", "ConnectFailed", "Relay"]

DRAIN_AFTER_CLOSE_SECONDS = 1.0
"""After stdin EOF and our close, how long frames already received may still reach stdout."""

Connect = Callable[[str], Awaitable[ClientConnection]]
Sink = Any  # a ByteSink (bridge.py): write(bytes), async drain()
_EOF = b""


class Relay:
    """Relays between the editor's stdio and the broker, across connections."""

    def __init__(
        self,
        connect: Connect,
        ring: UrlRing,
        backoff: Backoff,
        reader: asyncio.StreamReader,
        sink: Sink,
        redact: Callable[[str], str],
    ) -> None:
        self.connect = connect
        self.ring = ring
        self.backoff = backoff
        self.reader = reader
        self.sink = sink
        self.redact = redact
        self.state = BridgeState()
        self.inbox: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        self._background: set[asyncio.Task[Any]] = set()
        self._outage: _Outage | None = None
        self._editor_gone = asyncio.Event()
        """Set once stdin ended (EOF, or a read error)."""

    async def run(self, ws: ClientConnection) -> int:
        """Relay from the connection ``ws`` (to ``ring.current``) on; return the exit code."""
        feeder = asyncio.create_task(self._feed())
        try:
            link = Link(ws, self.ring.current)
            resume = False
            while True:
                self.state.connected()
                code = await self._serve(link, resume=resume)
                if code is not None:
                    return code
                again = await self._reconnect_unless_editor_gone(link)
                if isinstance(again, int):
                    return again
                link, resume = again, True
        finally:
            for task in (feeder, *self._background):
                task.cancel()
            await asyncio.gather(feeder, *self._background, return_exceptions=True)

    # -- one connection ---------------------------------------------------------------------

    async def _serve(self, link: Link, *, resume: bool) -> int | None:
        """Relay on ``link`` until it ends; an exit code, or None to reconnect."""
        downstream = asyncio.create_task(self._pump_broker(link))
        upstream: asyncio.Task[None] | None = None
        try:
            if resume:
                resuming = asyncio.create_task(self._resume(link))
                await asyncio.wait((resuming, downstream), return_when=asyncio.FIRST_COMPLETED)
                if not resuming.done():
                    resuming.cancel()
                    await asyncio.gather(resuming, return_exceptions=True)
                    return self._after_broker_ended(link, downstream)
                failure = resuming.exception()
                if isinstance(failure, _Fatal):
                    report(str(failure))
                    await link.ws.close(CloseCode.NORMAL_CLOSURE)
                    return 1
                if failure is not None:  # LinkLost: the new connection dropped too
                    await asyncio.wait((downstream,), timeout=DRAIN_AFTER_CLOSE_SECONDS)
                    return None
                if self.state.initialize is not None:  # else: once the broker speaks
                    self._back(link)
            upstream = asyncio.create_task(self._pump_editor(link))
            await asyncio.wait((upstream, downstream), return_when=asyncio.FIRST_COMPLETED)
            if downstream.done():
                return await self._after_broker_ended_closing(link, downstream)
            return await self._after_editor_ended(link, upstream, downstream)
        finally:
            link.lost()
            for task in (upstream, downstream):
                if task is not None:
                    task.cancel()
            await asyncio.gather(
                *(t for t in (upstream, downstream) if t is not None), return_exceptions=True
            )

    async def _pump_broker(self, link: Link) -> None:
        """Route every frame from the broker; return when the connection closes."""
        try:
            while True:
                frame = await link.ws.recv()
                if not link.heard:
                    link.heard = True
                    if self.state.initialize is None:  # nothing to resume: it carries on
                        self._back(link)
                await self._from_broker(link, frame)
        except ConnectionClosed:
            return

    async def _from_broker(self, link: Link, frame: str | bytes) -> None:
        line = frame_to_line(frame)
        if line is None:
            return
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):  # a batch, or not JSON: as it came
            await self._write(line)
            return
        if link.answered(message):
            return
        routed = self.state.from_broker(message)
        for out in routed.to_broker:
            await link.send(out)
        for item in routed.to_editor:
            await self._write(line if item is message else _line(item))

    async def _pump_editor(self, link: Link) -> None:
        """Send what the editor writes; return at its EOF (a stdin failure is raised)."""
        while True:
            item = await self.inbox.get()
            if isinstance(item, BaseException):
                raise item
            if item == _EOF:
                return
            await self._to_broker(link, item)

    async def _to_broker(self, link: Link, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            await link.send(line)  # the broker answers what is not JSON
            return
        out = self.state.from_editor(message)
        if out is None:
            return
        await link.send(line if out is message else out)

    async def _write(self, line: bytes) -> None:
        self.sink.write(line)
        await self.sink.drain()

    # -- endings ----------------------------------------------------------------------------

    def _after_broker_ended(self, link: Link, downstream: asyncio.Task[None]) -> int | None:
        error = downstream.exception()
        if isinstance(error, OSError):
            report(f"stdout is closed ({error}); closing the connection to {link.url}")
            return 1
        if error is not None:
            raise error
        if link.should_reconnect():
            return None
        report(
            f"server closed the connection to {self.redact(link.url)}: {describe_close(link.ws)}"
        )
        return 1

    async def _after_broker_ended_closing(
        self, link: Link, downstream: asyncio.Task[None]
    ) -> int | None:
        code = self._after_broker_ended(link, downstream)
        if code is not None and isinstance(downstream.exception(), OSError):
            await link.ws.close(CloseCode.GOING_AWAY, "client stdout closed")
        return code

    async def _after_editor_ended(
        self, link: Link, upstream: asyncio.Task[None], downstream: asyncio.Task[None]
    ) -> int | None:
        error = upstream.exception()
        if error is None:
            await link.ws.close()
            await asyncio.wait((downstream,), timeout=DRAIN_AFTER_CLOSE_SECONDS)
            # The server closing first at the same moment is a failure only when it was for
            # good: one that would have been reconnected does not matter, the editor left.
            if link.ws.protocol.close_rcvd_then_sent and not link.should_reconnect():
                where = self.redact(link.url)
                report(f"server closed the connection to {where}: {describe_close(link.ws)}")
                return 1
            return 0
        if isinstance(error, ConnectionClosed):  # a send found the connection gone
            await asyncio.wait((downstream,), timeout=DRAIN_AFTER_CLOSE_SECONDS)
            if link.should_reconnect():
                return None
            return self._after_broker_ended(link, downstream)
        if isinstance(error, ValueError):
            report(f"a stdin line exceeds the line limit ({error}); closing the connection")
            await link.ws.close(CloseCode.MESSAGE_TOO_BIG, "stdin line too long")
            return 1
        if isinstance(error, OSError):
            report(f"cannot read stdin ({error}); closing the connection")
            await link.ws.close(CloseCode.GOING_AWAY, "client stdin failed")
            return 1
        raise error

    # -- reconnecting -----------------------------------------------------------------------

    async def _reconnect_unless_editor_gone(self, lost: Link) -> Link | int:
        """:meth:`_reconnect`, unless the editor closes its end meanwhile (stdin's EOF: it
        is gone, nothing it wrote can be answered any more): then exit 0 at once."""
        reconnecting = asyncio.ensure_future(self._reconnect(lost))
        gone = asyncio.ensure_future(self._editor_gone.wait())
        try:
            await asyncio.wait((reconnecting, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not reconnecting.done():
            reconnecting.cancel()
            await asyncio.gather(reconnecting, return_exceptions=True)
            return 0
        link = reconnecting.result()
        return 1 if link is None else link

    async def _reconnect(self, lost: Link) -> Link | None:
        """A new connection (None: the broker stayed out of reach past the bound)."""
        self.state.lost()
        if self._outage is None:  # the lost connection had carried on: a new outage
            self.backoff.reset()
            self._outage = _Outage(time.monotonic(), lost.url, describe_close(lost.ws))
        else:
            self._outage.last_error = describe_close(lost.ws)
        outage = self._outage
        while True:
            pause = self.backoff.delay(time.monotonic())
            if pause is None:
                report(
                    f"gave up: the broker stayed out of reach for "
                    f"{time.monotonic() - outage.began:.0f} s after the connection to "
                    f"{self.redact(outage.url)} was lost ({outage.cause}); last error: "
                    f"{outage.last_error}"
                )
                return None
            await asyncio.sleep(pause)
            url = self.ring.current
            try:
                return Link(await self.connect(url), url)
            except ConnectFailed as exc:
                outage.last_error = str(exc)
                self.ring.failed()

    def _back(self, link: Link) -> None:
        """The new connection carries on (resumed, or nothing to resume and the broker
        spoke): the outage is over, one line says so."""
        outage, self._outage = self._outage, None
        if outage is None:
            return
        report(
            f"connection to {self.redact(outage.url)} lost ({outage.cause}); reconnected to "
            f"{self.redact(link.url)} after {time.monotonic() - outage.began:.1f} s, "
            f"resuming {len(self.state.sessions)} session(s)"
        )

    async def _resume(self, link: Link) -> None:
        """Make the new connection what the lost one was (see the module docstring)."""
        state = self.state
        state.initialized = None
        for request in state.handshake():
            answer = await link.call(request)
            if "error" in answer:
                raise _Fatal(f"the broker refused {request['method']} again: {answer['error']}")
            if request["method"] == "initialize":
                state.initialized = answer.get("result")
        resumes = state.resumes()
        answers = await asyncio.gather(*(link.call(r) for _, r in resumes))
        for (session_id, _), answer in zip(resumes, answers, strict=True):
            again = state.resume_from_log_end(session_id, answer.get("error"))
            if again is not None:
                report(f"session {session_id}: its last events were lost by the store")
                answer = await link.call(again)
            if "error" in answer:
                report(f"session {session_id} could not be resumed: {answer['error']}")
                state.resume_failed(session_id)
            else:
                state.resumed(session_id)
        for recovery in state.recoveries():
            if recovery.kind is RecoveryKind.ANSWER:
                await self._write(_line(recovery.message))
            elif recovery.kind is RecoveryKind.RESEND:
                await link.send(recovery.message)
            else:
                self._spawn(self._await_prompt(link, recovery.editor_id, recovery.message))

    async def _await_prompt(self, link: Link, editor_id: Any, request: JsonObject) -> None:
        """The outcome of a prompt sent on a lost connection, as the editor's answer."""
        try:
            answer = await link.call(request)
        except LinkLost:
            return  # asked again on the next connection
        await self._write(_line(self.state.prompt_settled(editor_id, answer)))

    # -- helpers ----------------------------------------------------------------------------

    async def _feed(self) -> None:
        """Read the editor's lines into :attr:`inbox` as they come; EOF as ``b""``."""
        try:
            while line := await self.reader.readline():
                message = line.rstrip(b"\r\n")
                if message and not message.isspace():
                    await self.inbox.put(message)
        except (ValueError, OSError) as exc:
            await self.inbox.put(exc)
            return
        finally:
            self._editor_gone.set()
        await self.inbox.put(_EOF)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


@dataclass
class _Outage:
    """Since when the broker is out of reach, and why the connection was lost."""

    began: float
    url: str
    cause: str
    last_error: str = ""

    def __post_init__(self) -> None:
        self.last_error = self.last_error or self.cause


class _Fatal(Exception):
    """The new connection refused what the lost one took: reconnecting cannot help."""


class ConnectFailed(Exception):
    """Raised by the ``connect`` callable when one attempt fails (the relay tries again);
    the message says why, on one line."""


def _line(message: JsonObject) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"
