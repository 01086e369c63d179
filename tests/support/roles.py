"""Worker roles (agent hosts, projectors) as real processes for multi-node tests."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from .broker_process import broker_env, spawn

DEMO = f"demo={sys.executable} -m broker.demo.agent"


class RoleProcess:
    """A running worker process."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.ready_line = ""

    async def kill(self) -> None:
        """SIGKILL, as a crash would."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()

    async def terminate(self, grace: float = 10.0) -> int:
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            return await asyncio.wait_for(self.proc.wait(), grace)
        except TimeoutError:
            await self.kill()
            return -9


@contextlib.asynccontextmanager
async def role_process(
    role: str,
    redis_url: str,
    log_path: Path,
    *,
    agents: Sequence[str] = (DEMO,),
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> AsyncIterator[RoleProcess]:
    """``acp-broker worker ROLE`` until the block ends; waits for its ready line."""
    args = [sys.executable, "-m", "broker.cli", "worker", role, "--redis-url", redis_url]
    if role == "agent-host":
        for spec in agents:
            args += ["--agent", spec]
    proc = await spawn(args, log_path, broker_env(None, env))
    node = RoleProcess(proc, log_path)
    drain: asyncio.Task[None] | None = None
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        if b"ready" not in line:
            log_text = log_path.read_text()[-2000:]  # noqa: ASYNC240 - a failing start
            raise RuntimeError(f"{role} did not start: {log_text}")
        node.ready_line = line.decode()
        drain = asyncio.create_task(_drain(proc.stdout))
        yield node
    finally:
        if proc.returncode is None:
            await node.terminate()
        if drain is not None:
            drain.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
