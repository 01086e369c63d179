"""Stopping agent processes nobody uses: a process per tenant (or per session) is cheap
only as long as idle ones go away."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from broker.errors.failures import describe

from .agents import AgentPool
from .sessions import HeldSessions

log = logging.getLogger(__name__)

_MAX_INTERVAL = 30.0


class IdleReaper:
    """Every while, stops the processes that have been sent nothing and said nothing for
    ``idle_timeout`` seconds and run no prompt and no client request: their sessions are
    let go first (``stop_session``: recorded STOPPED, a prompt or a resume brings them
    back on a new process)."""

    def __init__(
        self,
        agents: AgentPool,
        sessions: HeldSessions,
        stop_session: Callable[[str, str], Awaitable[None]],
        idle_timeout: float | None,
    ) -> None:
        self.agents = agents
        self.sessions = sessions
        self.stop_session = stop_session
        self.idle_timeout = idle_timeout
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.idle_timeout is not None and self._task is None:
            self._task = asyncio.create_task(self._run(self.idle_timeout), name="agent-reaper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self, idle_timeout: float) -> None:
        interval = min(idle_timeout / 4, _MAX_INTERVAL)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap(idle_timeout)
            except Exception as exc:  # the next round tries again; nothing is lost meanwhile
                log.warning("stopping idle agent processes failed: %s", describe(exc))

    async def reap(self, idle_timeout: float, now: float | None = None) -> int:
        """Stop the processes idle for ``idle_timeout`` seconds; returns how many."""
        now = time.monotonic() if now is None else now
        stopped = 0
        for process in self.agents.processes():
            if process.failed or now - process.last_active < idle_timeout:
                continue
            held = [h for h in self.sessions.by_id.values() if h.agent is process]
            if any(h.prompt_task is not None or h.client_requests for h in held):
                continue
            for session in held:
                await self.stop_session(session.tenant, session.session_id)
            self.agents.forget(process)
            await process.stop()
            log.info(
                "stopped agent %r of tenant %r: idle for %gs (%d sessions let go)",
                process.name,
                process.tenant,
                idle_timeout,
                len(held),
            )
            stopped += 1
        return stopped
