"""The agent processes a host runs: one per configured agent, started on demand."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from broker.config import AgentSpec
from broker.ops import metrics
from broker.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, RpcError, invalid_params

from .process import AgentEvents, AgentFailed, AgentProcess

log = logging.getLogger(__name__)

CLIENT_CAPABILITIES: JsonObject = {
    "fs": {"readTextFile": True, "writeTextFile": True},
    "terminal": True,
    "session": {"notices": {}},
}
"""What the broker tells agents its clients can do; requests go to a client that can. The
broker takes notices: clients that do not are sent an agent message instead."""


class AgentPool:
    """The agent processes of a host, by agent name; a failed one is started again."""

    def __init__(
        self,
        agents: Sequence[AgentSpec],
        events: AgentEvents,
        *,
        request_timeout: float,
        agent_env: Sequence[str],
        on_agent_started: Callable[[str, JsonObject], Awaitable[None]] | None,
    ) -> None:
        self.specs = {spec.name: spec for spec in agents}
        self.default_agent = agents[0].name
        self.events = events
        self.request_timeout = request_timeout
        self.agent_env = agent_env
        self.on_agent_started = on_agent_started
        self._processes: dict[str, AgentProcess] = {}
        self._starting: dict[str, asyncio.Lock] = {}

    async def process(self, name: str) -> AgentProcess:
        spec = self.specs.get(name)
        if spec is None:
            raise invalid_params(f"unknown agent {name!r}; configured: {', '.join(self.specs)}")
        lock = self._starting.setdefault(name, asyncio.Lock())
        async with lock:
            process = self._processes.get(name)
            if process is not None and not process.failed:
                return process
            process = AgentProcess(
                spec, self.events, request_timeout=self.request_timeout, env_allowed=self.agent_env
            )
            try:
                await process.start(CLIENT_CAPABILITIES)
            except AgentFailed as exc:
                await process.stop()
                raise RpcError(INTERNAL_ERROR, str(exc)) from None
            self._processes[name] = process
            metrics.AGENT_PROCESSES.inc()
            metrics.AGENT_STARTS.inc()
            if self.on_agent_started is not None:
                await self.on_agent_started(name, process.capabilities)
            return process

    def kind_of(self, agent: str) -> str:
        spec = self.specs.get(agent)
        if spec is None:
            raise invalid_params(f"unknown agent {agent!r}; configured: {', '.join(self.specs)}")
        return spec.kind

    async def start(self) -> None:
        """Start every configured agent now, so a broken command shows at start-up."""
        results = await asyncio.gather(
            *(self.process(name) for name in self.specs), return_exceptions=True
        )
        for name, result in zip(self.specs, results, strict=True):
            if isinstance(result, RpcError):
                log.error("agent %r is not usable yet: %s", name, result.message)

    def agent_pid(self, name: str) -> int | None:
        process = self._processes.get(name)
        return process.pid if process else None

    def forget(self, agent: AgentProcess) -> None:
        """A process failed: the next command for its agent starts another."""
        if self._processes.get(agent.name) is agent:
            del self._processes[agent.name]
            metrics.AGENT_PROCESSES.dec()

    async def stop(self) -> None:
        """Stop every agent process."""
        await asyncio.gather(*(p.stop() for p in self._processes.values()), return_exceptions=True)
        metrics.AGENT_PROCESSES.dec(len(self._processes))
        self._processes.clear()


async def ask(
    process: AgentProcess,
    method: str,
    params: JsonObject,
    *,
    timeout: float | None = -1.0,
) -> JsonObject:
    """Ask an agent; its failure is an internal error to the caller, a non-object reply {}."""
    try:
        result = await process.request(method, params, timeout=timeout)
    except AgentFailed as exc:
        raise RpcError(INTERNAL_ERROR, f"agent failed: {exc}") from None
    return result if isinstance(result, dict) else {}
