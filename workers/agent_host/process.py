"""One ACP agent running as a subprocess, spoken to over stdio.

Newline-delimited JSON-RPC both ways. The process is one peer: it answers our
requests, sends notifications (``session/update``) and makes requests of its
own (``session/request_permission``, ``fs/*``, ``terminal/*``). A process that
exits, stops answering, or writes a line that is not JSON-RPC is *failed*: it
is killed, every request waiting on it fails with :class:`AgentFailed`, and
its owner is told once, so the broker and other agents carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol

from broker.config import DEFAULT_AGENT_ENV, AgentSpec
from broker.protocol import jsonrpc
from broker.protocol.jsonrpc import Invalid, Request, RpcError
from broker.protocol.pending import PeerGone, PendingRequests

from .environment import agent_environment

log = logging.getLogger(__name__)

_LINE_LIMIT = 64 * 1024 * 1024
_LAST_WORDS_WAIT = 1.0
_EXIT_SAYS_WAIT = _LAST_WORDS_WAIT + 1.0
"""Seconds a broken input pipe waits for the process's exit to say why (its code, then up
to :data:`_LAST_WORDS_WAIT` for its last words)."""
"""Seconds an exited process's last lines on stderr are waited for, to say why it exited."""


class AgentFailed(Exception):
    """The agent process failed: it exited, hung or broke the protocol."""


class AgentEvents(Protocol):
    """What an agent process reports to its owner."""

    async def on_agent_notification(self, agent: AgentProcess, request: Request) -> None: ...

    async def settle(self, agent: AgentProcess) -> None:
        """Return once what the notifications so far stand for is done (in the log)."""

    async def on_agent_request(self, agent: AgentProcess, request: Request) -> Any: ...

    def on_agent_failed(self, agent: AgentProcess, reason: str) -> None: ...


class AgentProcess:
    """A running agent: spawn it, initialize it, talk to it, notice when it fails."""

    def __init__(
        self,
        spec: AgentSpec,
        events: AgentEvents,
        *,
        request_timeout: float,
        env_allowed: Sequence[str] = DEFAULT_AGENT_ENV,
        argv: Sequence[str] | None = None,
        tenant: str = "",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.argv = list(argv or spec.command)
        """What is run: the spec's command, or the command line that seals it."""
        self.tenant = tenant
        self.env = dict(env or {})
        """Variables set for it (a sealed agent's ``TMPDIR``); its spec's ``env`` wins."""
        """The tenant whose sessions this process runs ("" for the start-up check)."""
        self.key: tuple[str, str, tuple[str, ...]] = (spec.name, tenant, ())
        """Its place in the host's pool (set by the pool)."""
        self.last_active = time.monotonic()
        """When it last was sent or said something (idle processes are stopped)."""
        self.env_allowed = env_allowed
        self.events = events
        self.request_timeout = request_timeout
        self.capabilities: dict[str, Any] = {}
        self.failed: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._pending = PendingRequests()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._exit_watch: asyncio.Future[Any] | None = None
        self._write_lock = asyncio.Lock()
        self._last_stderr = ""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self, client_capabilities: dict[str, Any]) -> None:
        """Spawn the process and run ``initialize``; raises :class:`AgentFailed`."""
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=agent_environment(os.environ, self.env_allowed, {**self.env, **self.spec.env}),
                limit=_LINE_LIMIT,
            )
        except OSError as exc:
            raise AgentFailed(f"agent {self.name!r} could not start: {exc}") from exc
        self._spawn(self._read_stdout())
        stderr = self._spawn(self._read_stderr())
        self._exit_watch = self._spawn(self._watch_exit(stderr))
        result = await self.request(
            "initialize",
            {
                "protocolVersion": 1,
                "clientCapabilities": client_capabilities,
                "clientInfo": {"name": "acp-broker", "version": "0.1.0"},
            },
        )
        self.capabilities = (result or {}).get("agentCapabilities") or {}

    def supports_load(self) -> bool:
        return bool(self.capabilities.get("loadSession"))

    def supports(self, session_capability: str) -> bool:
        caps = self.capabilities.get("sessionCapabilities") or {}
        return caps.get(session_capability) is not None

    async def request(self, method: str, params: Any, *, timeout: float | None = -1.0) -> Any:
        """Send a request and wait for the result (``timeout=None``: wait as long as it takes).

        Raises :class:`RpcError` when the agent answers with an error and
        :class:`AgentFailed` when it fails first. A request the agent leaves
        unanswered past the timeout means the agent hangs: it is failed.
        """
        if self.failed:
            raise AgentFailed(self.failed)
        msg_id, future = self._pending.open()
        await self._write(jsonrpc.request(msg_id, method, params))
        limit = self.request_timeout if timeout == -1.0 else timeout
        try:
            return await asyncio.wait_for(future, limit)
        except TimeoutError:
            self.fail(f"agent {self.name!r} did not answer {method} within {limit:g}s")
            raise AgentFailed(self.failed or "") from None
        except PeerGone as exc:
            raise AgentFailed(str(exc)) from None
        finally:
            self._pending.discard(msg_id)

    async def notify(self, method: str, params: Any) -> None:
        if not self.failed:
            await self._write(jsonrpc.notification(method, params))

    async def _write(self, message: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        data = (jsonrpc.encode(message) + "\n").encode()
        self.last_active = time.monotonic()
        async with self._write_lock:
            try:
                self._proc.stdin.write(data)
                await self._proc.stdin.drain()
            except (ConnectionError, RuntimeError) as exc:
                # A pipe broken by an agent that exited (one that could not start, say):
                # its exit code and last words say why, not the pipe.
                if self._exit_watch is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(self._exit_watch), _EXIT_SAYS_WAIT)
                self.fail(f"agent {self.name!r} stopped reading its input: {exc}")
                raise AgentFailed(self.failed or "") from None

    async def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        while not self.failed:
            try:
                line = await stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                self.fail(f"agent {self.name!r} wrote a line longer than {_LINE_LIMIT} bytes")
                return
            if not line:
                return
            if line.strip():
                await self._handle_line(line)

    async def _handle_line(self, line: bytes) -> None:
        self.last_active = time.monotonic()
        message = jsonrpc.parse_frame(line)
        if isinstance(message, Invalid):
            self.fail(f"agent {self.name!r} wrote something that is not JSON-RPC: {line[:80]!r}")
        elif isinstance(message, jsonrpc.Response):
            # The updates the agent sent before its reply (say, a prompt's) are in the log
            # before the reply is acted on.
            await self.events.settle(self)
            self._pending.resolve(message)
        elif message.is_notification:
            await self.events.on_agent_notification(self, message)
        else:
            await self.events.settle(self)
            self._spawn(self._answer(message))

    async def _answer(self, request: Request) -> None:
        assert request.id is not None
        try:
            result = await self.events.on_agent_request(self, request)
            reply = jsonrpc.result_reply(request.id, result)
        except RpcError as exc:
            reply = jsonrpc.error_reply(request.id, exc)
        except Exception:
            log.exception("answering %s for agent %s failed", request.method, self.name)
            reply = jsonrpc.error_reply(
                request.id, RpcError(jsonrpc.INTERNAL_ERROR, "internal error")
            )
        with contextlib.suppress(AgentFailed):
            await self._write(reply)

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while line := await self._proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self._last_stderr = text or self._last_stderr
            log.info("agent %s: %s", self.name, text)

    async def _watch_exit(self, stderr: asyncio.Future[Any]) -> None:
        assert self._proc is not None
        code = await self._proc.wait()
        # Its last words say why (a sandbox that could not be set up says so there).
        await asyncio.wait({stderr}, timeout=_LAST_WORDS_WAIT)
        said = f": {self._last_stderr[:200]}" if self._last_stderr else ""
        self.fail(f"agent {self.name!r} exited with code {code}{said}")

    def fail(self, reason: str) -> None:
        """Mark the process failed (once), kill it, fail what waits on it, tell the owner."""
        if self.failed:
            return
        self.failed = reason
        log.warning("%s", reason)
        if self._proc and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        self._pending.fail_all(reason)
        self.events.on_agent_failed(self, reason)

    async def stop(self, grace: float = 2.0) -> None:
        """End the process: close its input, then terminate, then kill."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        self.failed = self.failed or f"agent {self.name!r} was stopped"
        self._pending.fail_all(self.failed)
        if proc.stdin:
            proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
