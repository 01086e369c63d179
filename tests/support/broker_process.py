"""A broker as a real subprocess: ``python -m broker.cli serve --port 0 …``.

:func:`broker_process` starts ``acp-broker serve`` on a free port, waits (bounded) for the
line ``acp-broker ready on ws://HOST:PORT/acp`` on its stdout to learn the URL, and stops it
afterwards: SIGTERM, then SIGKILL after a grace period. :meth:`BrokerProcess.kill` is the
crash variant (SIGKILL, no clean-up at all). The broker's stderr goes to a log file and its
stdout is drained after the ready line, so neither pipe can fill up and block the broker.

Everything is asyncio-based, so it can share an event loop with an in-process broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .client import BROKER_DEADLINE, LOADED_WAIT

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "tests" / "agents"
READY = re.compile(r"acp-broker ready on (ws://(?P<host>[^:/\s]+):(?P<port>\d+)(?P<path>/\S*))")

START_TIMEOUT = LOADED_WAIT
"""Seconds a broker process may take to say it is ready: its imports and start take 1-2 s
alone, tens of seconds when the suite shares two cores with other work."""
STOP_GRACE = 10.0

DEMO_AGENT = f"demo={shlex.quote(sys.executable)} -m broker.demo.agent"
PLAIN_AGENT = f"plain={shlex.quote(sys.executable)} {shlex.quote(str(AGENTS / 'plain_agent.py'))}"


class BrokerStartError(RuntimeError):
    """The broker process exited or stayed silent before its ready line."""


@dataclass
class BrokerProcess:
    """A running ``acp-broker serve`` process."""

    proc: asyncio.subprocess.Process
    url: str
    port: int
    log_path: Path
    _drain: asyncio.Task[None] | None = field(default=None, repr=False)
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    @property
    def http_port(self) -> int:
        """The port of its HTTP listener (REST, MCP), as its ready line says."""
        match = re.search(r"and http://[^:]+:(\d+)", "".join(self.stdout_lines))
        assert match, self.stdout_lines
        return int(match[1])

    def log_text(self) -> str:
        """What the broker wrote to stderr so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    async def kill(self) -> int:
        """SIGKILL: the broker dies on the spot, nothing is cleaned up. Returns its status."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        return await self._reap(STOP_GRACE)

    async def terminate(self, grace: float = STOP_GRACE) -> int:
        """SIGTERM (a graceful stop), then SIGKILL if it is still there after ``grace``."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                return await self._reap(grace)
            except TimeoutError:
                return await self.kill()
        return await self._reap(grace)

    async def _reap(self, timeout: float) -> int:
        status = await asyncio.wait_for(self.proc.wait(), timeout)
        if self._drain is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._drain, 2.0)
        return status


def broker_env(
    state_dir: Path | str | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a test broker process runs in (its agents inherit it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["PYTHONUNBUFFERED"] = "1"
    env["ACP_DEMO_TEST_COMMANDS"] = "1"
    env["ACP_DEMO_CHUNK_DELAY"] = "0"
    if state_dir is not None:
        env["ACP_DEMO_STATE_DIR"] = str(state_dir)
    # Settings the test did not ask for must not leak in from the caller's environment.
    for key in list(env):
        if key.startswith("ACP_BROKER_"):
            del env[key]
    env["ACP_BROKER_SANDBOX"] = "off"  # as tests/conftest.py's TEST_SANDBOX says why
    env["ACP_BROKER_REQUEST_TIMEOUT"] = str(BROKER_DEADLINE)  # as its docstring says why
    env.update(extra or {})
    return env


async def spawn(
    args: Sequence[str], log_path: Path, env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """``args`` run from the tree's root in ``env``: stdout piped to the caller, stderr
    appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:  # noqa: ASYNC230 - a local file, opened once
        return await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            env=env,
            cwd=str(ROOT),
            start_new_session=True,  # a Ctrl-C in the terminal goes to pytest only
        )


@contextlib.asynccontextmanager
async def broker_process(
    redis_url: str | None,
    *,
    log_path: Path,
    state_dir: Path | str | None = None,
    cursor_secret: str = "test-secret",
    agents: Sequence[str] = (DEMO_AGENT,),
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    start_timeout: float = START_TIMEOUT,
    stop_grace: float = STOP_GRACE,
) -> AsyncIterator[BrokerProcess]:
    """Run ``acp-broker serve`` as a subprocess until the block ends (then SIGTERM it).

    ``agents`` are ``--agent`` specs (``NAME=COMMAND ARGS…``, the first is the default);
    ``env`` adds to the environment (e.g. ``ACP_BROKER_LIST_PAGE_SIZE``). stderr is appended
    to ``log_path``.
    """
    args = [sys.executable, "-m", "broker.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    if redis_url is not None:
        args += ["--redis-url", redis_url]
    args += ["--cursor-secret", cursor_secret]
    for spec in agents:
        args += ["--agent", spec]
    args += list(extra_args)
    proc = await spawn(args, log_path, broker_env(state_dir, env))
    node: BrokerProcess | None = None
    try:
        node = await _wait_ready(proc, log_path, start_timeout)
        yield node
    finally:
        if node is not None:
            await node.terminate(stop_grace)
        elif proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def _wait_ready(
    proc: asyncio.subprocess.Process, log_path: Path, timeout: float
) -> BrokerProcess:
    assert proc.stdout is not None
    seen: list[str] = []

    async def read_until_ready() -> re.Match[str]:
        assert proc.stdout is not None
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                await proc.wait()
                raise BrokerStartError(
                    f"acp-broker exited with {proc.returncode} before it was ready;\n"
                    f"stdout: {''.join(seen)!r}\nstderr:\n{_tail(log_path)}"
                )
            line = raw.decode(errors="replace")
            seen.append(line)
            match = READY.search(line)
            if match:
                return match

    try:
        match = await asyncio.wait_for(read_until_ready(), timeout)
    except TimeoutError:
        raise BrokerStartError(
            f"acp-broker printed no ready line within {timeout:g}s;\n"
            f"stdout: {''.join(seen)!r}\nstderr:\n{_tail(log_path)}"
        ) from None
    node = BrokerProcess(proc, match[1], int(match["port"]), log_path, stdout_lines=seen)
    node._drain = asyncio.create_task(_drain(proc.stdout, seen), name=f"drain-{proc.pid}")
    return node


async def _drain(stream: asyncio.StreamReader, into: list[str]) -> None:
    """Keep reading the broker's stdout so the pipe never fills."""
    while True:
        raw = await stream.readline()
        if not raw:
            return
        into.append(raw.decode(errors="replace"))


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except FileNotFoundError:
        return ""
