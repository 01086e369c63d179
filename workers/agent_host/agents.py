"""The agent processes a host runs: one per agent and tenant, sealed, started on demand."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from broker.config import AgentSpec
from broker.ops import metrics
from broker.protocol.jsonrpc import (
    INTERNAL_ERROR,
    LIMIT_EXCEEDED,
    JsonObject,
    RpcError,
    invalid_params,
)

from .process import AgentEvents, AgentFailed, AgentProcess
from .sandbox import SEALED_ENV, SandboxPlan, SandboxPolicy, SandboxRefused, Sealer

log = logging.getLogger(__name__)

CLIENT_CAPABILITIES: JsonObject = {
    "fs": {"readTextFile": True, "writeTextFile": True},
    "terminal": True,
    "session": {"notices": {}},
}
"""What the broker tells agents its clients can do; requests go to a client that can. The
broker takes notices: clients that do not are sent an agent message instead."""


ProcessKey = tuple[str, str, tuple[str, ...]]
"""(agent name, tenant, scope): the scope is the session's directories for a sealed
process (its mounts are made at its start), the session id for a spec with
``process_per = "session"``, nothing otherwise."""


class AgentPool:
    """The agent processes of a host: one per agent and tenant (and, sealed, per set of
    working directories; or per session), started on demand, a failed one started again.
    No process runs two tenants' sessions."""

    def __init__(
        self,
        agents: Sequence[AgentSpec],
        events: AgentEvents,
        *,
        request_timeout: float,
        agent_env: Sequence[str],
        on_agent_started: Callable[[str, JsonObject], Awaitable[None]] | None,
        sandbox: SandboxPolicy | None = None,
        max_processes: int | None = None,
    ) -> None:
        self.specs = {spec.name: spec for spec in agents}
        self.default_agent = agents[0].name
        self.events = events
        self.request_timeout = request_timeout
        self.agent_env = agent_env
        self.on_agent_started = on_agent_started
        self.sealer = Sealer(sandbox or SandboxPolicy())
        self.max_processes = max_processes
        self._processes: dict[ProcessKey, AgentProcess] = {}
        self._starting: dict[ProcessKey, asyncio.Lock] = {}
        self._launching = 0

    def spec(self, name: str) -> AgentSpec:
        spec = self.specs.get(name)
        if spec is None:
            raise invalid_params(f"unknown agent {name!r}; configured: {', '.join(self.specs)}")
        return spec

    async def process(
        self, name: str, tenant: str, dirs: Sequence[str] = (), session_id: str = ""
    ) -> AgentProcess:
        """The process that runs ``tenant``'s session (in ``dirs``: its ``cwd`` and
        ``additionalDirectories``) on agent ``name``, started if there is none."""
        spec = self.spec(name)
        plan = await self._plan(spec)
        scope: tuple[str, ...] = ()
        if spec.process_per == "session":
            scope = (session_id,)
        elif plan is not None:
            scope = tuple(dirs)
        key = (name, tenant, scope)
        lock = self._starting.setdefault(key, asyncio.Lock())
        async with lock:
            process = self._processes.get(key)
            if process is not None and not process.failed:
                return process
            self._check_room(key)
            self._launching += 1
            try:
                process = await self._start(spec, plan, tenant, dirs)
            finally:
                self._launching -= 1
            process.key = key
            self._processes[key] = process
            metrics.AGENT_PROCESSES.inc()
            return process

    def _check_room(self, key: ProcessKey) -> None:
        """Refuse one process more than ``max_processes`` (a failed one's place is free)."""
        running = len(self._processes) - (key in self._processes) + self._launching
        if self.max_processes is not None and running >= self.max_processes:
            raise RpcError(
                LIMIT_EXCEEDED,
                f"limit exceeded: this agent host runs {running} agent processes "
                "(max_agent_processes); try again when an idle one is stopped",
                {"limit": "max_agent_processes"},
            )

    async def _plan(self, spec: AgentSpec) -> SandboxPlan | None:
        try:
            return await self.sealer.plan(spec)
        except SandboxRefused as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from None

    async def _start(
        self, spec: AgentSpec, plan: SandboxPlan | None, tenant: str, dirs: Sequence[str]
    ) -> AgentProcess:
        argv = list(spec.command)
        if plan is not None:
            try:
                argv = plan.command(
                    spec.command,
                    [*dirs, *spec.rw_paths],
                    network=spec.network,
                    readable=spec.ro_paths,
                )
            except SandboxRefused as exc:
                raise invalid_params(str(exc)) from None
        process = AgentProcess(
            spec,
            self.events,
            request_timeout=self.request_timeout,
            env_allowed=self.agent_env,
            argv=argv,
            tenant=tenant,
            env=SEALED_ENV if plan is not None else None,
        )
        try:
            await process.start(CLIENT_CAPABILITIES)
            metrics.AGENT_STARTS.inc()
            if self.on_agent_started is not None:
                await self.on_agent_started(spec.name, process.capabilities)
        except AgentFailed as exc:
            await process.stop()
            raise RpcError(INTERNAL_ERROR, str(exc)) from None
        except BaseException:
            # Cancelled (its host stopping) or failed otherwise before the pool holds it:
            # nothing else would ever stop this process, so it is killed here, at once,
            # and the error goes on to the caller.
            process.fail(f"agent {spec.name!r} was stopped while it started")
            raise
        return process

    def kind_of(self, agent: str) -> str:
        return self.spec(agent).kind

    async def start(self, *, prestart: bool = True) -> None:
        """Say how this host's agents run (sealed or not, once); with ``prestart``, start
        every configured agent once now (sealed as its sessions' would be, then stopped), so
        a broken command or a sandbox that cannot start shows at start-up, and its
        capabilities are known before a session asks for it."""
        line, warn = await self.sealer.describe(list(self.specs.values()))
        log.log(logging.WARNING if warn else logging.INFO, "%s", line)
        if not prestart:
            return
        results = await asyncio.gather(
            *(self._check(spec) for spec in self.specs.values()), return_exceptions=True
        )
        for name, result in zip(self.specs, results, strict=True):
            if isinstance(result, RpcError):
                log.error("agent %r is not usable: %s", name, result.message)

    async def _check(self, spec: AgentSpec) -> None:
        process = await self._start(spec, await self._plan(spec), "", ())
        await process.stop()

    def agent_pid(self, name: str) -> int | None:
        """The pid of the newest process of agent ``name`` (tests signal it)."""
        pids = [p.pid for key, p in self._processes.items() if key[0] == name]
        return pids[-1] if pids else None

    def processes(self) -> list[AgentProcess]:
        return list(self._processes.values())

    def forget(self, agent: AgentProcess) -> None:
        """A process failed or was stopped: the next command for its key starts another."""
        if self._processes.get(agent.key) is agent:
            del self._processes[agent.key]
            lock = self._starting.get(agent.key)
            if lock is not None and not lock.locked():  # keys come and go with tenants
                del self._starting[agent.key]
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
