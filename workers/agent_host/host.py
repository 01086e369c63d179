"""The agent host: runs agents, holds sessions, executes commands for them.

The host keeps one process per configured agent and maps broker session ids
to the agent's own session ids, which never leave it. Everything an agent says
about a session is appended to the session's log; agent-to-client requests go
to a client connection through a :class:`ClientChannel`. A session whose
process is gone is brought back on demand (``session/load``, else
``session/resume``, else a fresh agent session with a notice in the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.config import DEFAULT_AGENT_ENV, AgentSpec
from broker.failures import describe
from broker.ops import metrics
from broker.protocol import capabilities
from broker.protocol.commands import PromptOutcome
from broker.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    JsonObject,
    Request,
    RpcError,
    invalid_params,
    session_not_found,
)
from broker.protocol.trace import trace_fields, with_trace
from broker.store.events import EventType, SessionSnapshot, Status
from broker.store.log import (
    Fenced,
    Position,
    SessionFull,
    SessionLog,
    SessionMissing,
    call_ids,
    new_session_id,
)
from broker.store.retry import STORE_AWAY

from .leases import Leases
from .process import AgentEvents, AgentFailed, AgentProcess

log = logging.getLogger(__name__)

CLIENT_CAPABILITIES: JsonObject = {
    "fs": {"readTextFile": True, "writeTextFile": True},
    "terminal": True,
    "session": {"notices": {}},
}
"""What the broker tells agents its clients can do; requests go to a client that can. The
broker takes notices: clients that do not are sent an agent message instead."""

USER_ACTIONS = frozenset({"session/request_permission", "elicitation/create"})
APPEND_BATCH = 16
APPEND_RETRY_PAUSES = (0.2, 0.4, 0.8, 1.6)
"""Seconds between attempts to log an agent's updates while the store is unreachable."""
STORE_AWAY_PAUSE = 1.0
"""Seconds between attempts once those are spent: the updates wait, kept in order."""
"""Agent requests that block the running prompt on a person: logged as ``state`` events."""

RUNAWAY_NOTICE = (
    "This session reached its event limit (max_events_per_session): the agent's turn was "
    "stopped and nothing more is recorded. Start a new session to go on."
)

_NO_RESTORE_NOTICE: JsonObject = {
    "type": EventType.NOTICE,
    "severity": "warning",
    "title": "The agent started this session afresh",
    "text": (
        "The agent could not load or resume this session, so it starts afresh: it does not "
        "remember the conversation above. The broker's log still holds all of it."
    ),
}

_MAX_ORPHANS = 100

_FORK_COPIES = frozenset(
    {EventType.UPDATE, EventType.PROMPT, EventType.PROMPT_END, EventType.STATE}
)
"""What a fork's log copies of its parent's: the conversation, not the parent's own life
(its creation, statuses, agent bindings) nor the broker's notices (live only)."""


def _fork_copies(body: JsonObject) -> bool:
    """Whether a fork copies this event of its parent's (no notice: they are live only)."""
    update = body.get("update")
    if isinstance(update, dict) and update.get("sessionUpdate") == "notice":
        return False
    return body.get("type") in _FORK_COPIES


class _Failed(Exception):
    """The updates of a batch were given up on (their sessions are failed)."""


_ABANDONED_PROMPT: JsonObject = {
    "code": INTERNAL_ERROR,
    "message": "the agent host running this prompt stopped; the session was taken over",
}


class ClientChannel(Protocol):
    """How the host reaches a client connection where a session is active."""

    async def request_client(
        self, tenant: str, session_id: str, method: str, params: JsonObject, prefer: str | None
    ) -> Any: ...


@dataclass(eq=False)
class HeldSession:
    """A session an agent process holds on this host."""

    tenant: str
    session_id: str
    agent: AgentProcess
    agent_session_id: str
    fence: str = ""  # the lease's fencing token; the log rejects appends with a stale one
    ready: bool = False  # its log exists and its updates may be appended
    restoring: bool = False  # the agent is replaying history we already have: drop it
    early: list[JsonObject] = field(default_factory=list)  # updates that came before ready
    prompt_origin: str | None = None  # the connection whose prompt is running
    ending: asyncio.Future[None] | None = None  # done once the turn's end is in the log
    prompt_task: asyncio.Task[Any] | None = None
    client_requests: set[asyncio.Task[Any]] = field(default_factory=set)


class AgentHost(AgentEvents):
    """Runs agents and executes session commands against them."""

    def __init__(
        self,
        agents: Sequence[AgentSpec],
        session_log: SessionLog,
        clients: ClientChannel,
        leases: Leases,
        *,
        request_timeout: float = 60.0,
        cancel_grace: float = 10.0,
        agent_env: Sequence[str] = DEFAULT_AGENT_ENV,
        on_agent_started: Callable[[str, JsonObject], Awaitable[None]] | None = None,
        max_pending_updates: int = 10_000,
    ) -> None:
        self.specs = {spec.name: spec for spec in agents}
        self.max_pending_updates = max_pending_updates
        self.default_agent = agents[0].name
        self.log = session_log
        self.clients = clients
        self.leases = leases
        self.request_timeout = request_timeout
        self.cancel_grace = cancel_grace
        self.agent_env = agent_env
        self.on_agent_started = on_agent_started
        self._processes: dict[str, AgentProcess] = {}
        self._starting: dict[str, asyncio.Lock] = {}
        self._held: dict[str, HeldSession] = {}
        self._by_agent_sid: dict[tuple[int, str], HeldSession] = {}
        self._restore_locks: dict[str, asyncio.Lock] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._full: set[str] = set()  # sessions told they reached max_events_per_session
        self._orphans: dict[tuple[int, str], list[JsonObject]] = {}
        self._updates: list[tuple[HeldSession, JsonObject]] = []  # waiting for the log
        self._appender: asyncio.Future[None] | None = None
        self._store_away = False

    # -- commands -------------------------------------------------------------------------

    async def new_session(
        self,
        tenant: str,
        params: JsonObject,
        *,
        agent: str,
        kind: str,
        meta: JsonObject,
        origin: str,
    ) -> tuple[str, JsonObject]:
        """Create a session on ``agent``; returns the broker's session id and the agent's reply."""
        process = await self._process(agent)
        capabilities.check_mcp_servers(agent, process.capabilities, params.get("mcpServers"))
        reply = await self._ask(process, "session/new", params)
        agent_sid = _agent_session_id(agent, reply)
        session_id = new_session_id()
        held = self._hold(tenant, session_id, process, agent_sid)
        await self.log.create(
            tenant, session_id, _created(params, agent=agent, kind=kind, meta=meta, origin=origin)
        )
        held.fence = (await self.leases.acquire(tenant, session_id)).fence
        await self._append(held, {"type": EventType.BOUND, "agentSessionId": agent_sid})
        await self._make_ready(held)
        return session_id, {**reply, "sessionId": session_id}

    async def fork(
        self, tenant: str, parent_id: str, params: JsonObject, *, meta: JsonObject, origin: str
    ) -> tuple[str, JsonObject, int]:
        """Fork a session (ACP unstable ``session/fork``) on the agent that holds it.

        The new session gets its own log, which starts with a copy of the parent's
        history up to the fork (its prompts, updates and their ends); the agent's
        fork carries its context. Returns the new session's id, the agent's reply,
        and the seq of the new log's last copied event. A parent whose prompt is
        still running cannot be forked (-32600): its turn has no end to copy yet.
        """
        held = await self._require(tenant, parent_id, {})
        agent = held.agent
        capabilities.check_session(agent.name, agent.capabilities, "fork", "session/fork")
        capabilities.check_mcp_servers(agent.name, agent.capabilities, params.get("mcpServers"))
        await self.settle()
        parent = await self.log.snapshot(tenant, parent_id)
        if parent.prompt_id is not None or held.prompt_task is not None:
            raise RpcError(INVALID_REQUEST, "a prompt is running in this session: fork it after")
        history = await self.log.read(tenant, parent_id, until=parent.seq, epoch=parent.epoch)
        fork = {**params, "sessionId": held.agent_session_id}
        reply = await self._ask(agent, "session/fork", fork)
        agent_sid = _agent_session_id(agent.name, reply)
        session_id = new_session_id()
        child = self._hold(tenant, session_id, agent, agent_sid)
        created = history[0].body if history else {}
        body = _created(
            params,
            agent=parent.agent,
            kind=parent.kind,
            meta={**(created.get("meta") or {}), **meta},
            origin=origin,
        )
        body["forkedFrom"] = {"sessionId": parent_id, "seq": parent.seq}
        await self.log.create(tenant, session_id, body)
        child.fence = (await self.leases.acquire(tenant, session_id)).fence
        copied = await self._copy_history(child, [e.body for e in history])
        await self._append(child, {"type": EventType.BOUND, "agentSessionId": agent_sid})
        await self._make_ready(child)
        return session_id, {**reply, "sessionId": session_id}, copied

    async def _copy_history(self, held: HeldSession, bodies: list[JsonObject]) -> int:
        """Append a parent's history events to a fork's log, in order; returns the last seq."""
        last = 1
        copies = [body for body in bodies if _fork_copies(body)]
        for start in range(0, len(copies), APPEND_BATCH):
            batch = copies[start : start + APPEND_BATCH]
            items = [(held.tenant, held.session_id, body, held.fence) for body in batch]
            for result in await self._log_retrying(items):
                if isinstance(result, Exception):
                    raise RpcError(INTERNAL_ERROR, f"could not copy the history: {result}")
                last = result.seq
        return last

    async def attach(self, tenant: str, session_id: str, params: JsonObject) -> JsonObject:
        """Make sure an agent holds the session (for load/resume/prompt); returns the agent's reply
        to the call that restored it ({} when it was held already)."""
        if session_id in self._held:
            return {}
        lock = self._restore_locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            if session_id in self._held:
                return {}
            return await self._restore(tenant, session_id, params)

    async def prompt(
        self,
        tenant: str,
        session_id: str,
        params: JsonObject,
        origin: str,
        prompt_id: str | None = None,
    ) -> PromptOutcome:
        """Run one prompt turn; the log records the prompt, every update and the outcome."""
        held = await self._require(tenant, session_id, params)
        while held.ending is not None:  # the previous turn's end goes into the log first
            await asyncio.shield(held.ending)
        if held.prompt_task is not None:
            raise RpcError(INVALID_REQUEST, "a prompt is already running in this session")
        capabilities.check_prompt(held.agent.name, held.agent.capabilities, params.get("prompt"))
        prompt_id = prompt_id or secrets.token_hex(8)
        await self._append(
            held,
            {
                "type": EventType.PROMPT,
                "promptId": prompt_id,
                "origin": origin,
                "prompt": params.get("prompt", []),
            },
        )
        held.prompt_origin = origin
        held.prompt_task = asyncio.current_task()
        try:
            result = await self._ask(
                held.agent,
                "session/prompt",
                {**params, "sessionId": held.agent_session_id},
                timeout=None,
            )
        except RpcError as exc:
            await self._end_prompt(held, prompt_id, error=exc.to_json())
            raise
        finally:
            held.prompt_task = None
            held.prompt_origin = None
        position = await self._end_prompt(held, prompt_id, result=result)
        return PromptOutcome(result, position)

    async def cancel(self, tenant: str, session_id: str) -> None:
        """Cancel the running prompt: tell the agent, settle its pending client requests."""
        held = self._held.get(session_id)
        if held is None or held.tenant != tenant:
            return
        for task in list(held.client_requests):
            task.cancel()
        with contextlib.suppress(AgentFailed):
            await held.agent.notify("session/cancel", {"sessionId": held.agent_session_id})
        if held.prompt_task is not None:
            asyncio.get_running_loop().call_later(
                self.cancel_grace, self._check_cancelled, held, held.prompt_task
            )

    async def forward(self, tenant: str, session_id: str, method: str, params: JsonObject) -> Any:
        """Pass a session request (set_mode, set_config_option) to the agent that holds it."""
        held = await self._require(tenant, session_id, {})
        return await self._ask(held.agent, method, {**params, "sessionId": held.agent_session_id})

    async def close(self, tenant: str, session_id: str, origin: str) -> None:
        """A connection closed the session: cancel the prompt it started, if one runs."""
        held = self._held.get(session_id)
        if held is not None and held.tenant == tenant and held.prompt_origin == origin:
            await self.cancel(tenant, session_id)

    async def release(self, tenant: str, session_id: str) -> None:
        """Stop holding the session (deleted): cancel its work, close it in the agent."""
        held = self._held.get(session_id)
        if held is None or held.tenant != tenant:
            return
        await self.cancel(tenant, session_id)
        self._drop(held)
        await self.leases.release(tenant, session_id)
        await self.leases.forget(tenant, session_id)
        if held.agent.supports("close"):
            with contextlib.suppress(AgentFailed, RpcError):
                await held.agent.request("session/close", {"sessionId": held.agent_session_id})

    async def stop(self, *, hand_over: bool = False) -> None:
        """Stop every agent. Held sessions are recorded as STOPPED, or, with ``hand_over``,
        left RUNNING for another agent host to take over at once."""
        for held in list(self._held.values()):
            self._drop(held)
            try:
                if not hand_over:
                    await self._append(held, {"type": EventType.STATUS, "status": Status.STOPPED})
                await self.leases.release(held.tenant, held.session_id, hand_over=hand_over)
            except Exception as exc:  # the others are stopped still; this lease lapses by itself
                log.warning(
                    "could not record session %s as stopped: %s", held.session_id, describe(exc)
                )
        await asyncio.gather(*(p.stop() for p in self._processes.values()), return_exceptions=True)
        metrics.AGENT_PROCESSES.dec(len(self._processes))
        self._processes.clear()

    def kind_of(self, agent: str) -> str:
        spec = self.specs.get(agent)
        if spec is None:
            raise invalid_params(f"unknown agent {agent!r}; configured: {', '.join(self.specs)}")
        return spec.kind

    async def start(self) -> None:
        """Start every configured agent now, so a broken command shows at start-up."""
        results = await asyncio.gather(
            *(self._process(name) for name in self.specs), return_exceptions=True
        )
        for name, result in zip(self.specs, results, strict=True):
            if isinstance(result, RpcError):
                log.error("agent %r is not usable yet: %s", name, result.message)

    def held_sessions(self) -> list[tuple[str, str]]:
        """(tenant, session id) of every session held here, for lease renewal."""
        return [(h.tenant, h.session_id) for h in self._held.values()]

    def fences(self) -> dict[str, str]:
        """Session id -> the fencing token this host holds it with."""
        return {h.session_id: h.fence for h in self._held.values()}

    def lose(self, session_id: str, *, vanished: bool = False) -> None:
        """The lease was lost (this host stalled), or the session ``vanished`` from the
        store (Redis came back without its data): stop running the session here."""
        held = self._held.get(session_id)
        if held is not None:
            if vanished:
                log.warning(
                    "session %s is gone from the store (Redis lost it): no longer run here",
                    session_id,
                )
            else:
                log.warning("lost the lease on session %s; another host runs it now", session_id)
            self._drop(held)

    def holds(self, session_id: str) -> bool:
        return session_id in self._held

    def prompt_origin(self, session_id: str) -> str | None:
        held = self._held.get(session_id)
        return held.prompt_origin if held else None

    def agent_pid(self, name: str) -> int | None:
        process = self._processes.get(name)
        return process.pid if process else None

    # -- agent events ---------------------------------------------------------------------

    async def on_agent_notification(self, agent: AgentProcess, request: Request) -> None:
        if request.method != "session/update":
            return
        key = (id(agent), str(request.params.get("sessionId")))
        held = self._by_agent_sid.get(key)
        update = request.params.get("update")
        if not isinstance(update, dict) or (held is not None and held.restoring):
            return
        body: JsonObject = {"type": EventType.UPDATE, "update": update}
        if held is None:
            self._keep_orphan(key, body)
        elif held.ready:
            self._queue_update(held, body)
        else:
            held.early.append(body)

    def _queue_update(self, held: HeldSession, body: JsonObject) -> None:
        """Log an agent's update soon, in order: the updates that arrive while an append is
        on its way go to the log together, in one round trip, once it is back."""
        self._updates.append((held, body))
        if self._appender is None or self._appender.done():
            self._appender = asyncio.ensure_future(self._append_updates())

    async def _append_updates(self) -> None:
        while self._updates:
            # At most 16 a round trip: a session knows its last 16 appends, so a batch
            # tried again after an unknown outcome lands each of its updates once.
            batch, self._updates = self._updates[:APPEND_BATCH], self._updates[APPEND_BATCH:]
            items = [(h.tenant, h.session_id, body, h.fence) for h, body in batch]
            try:
                results = await self._log_kept(batch, items)
            except _Failed:
                continue
            except Exception as exc:  # the store refused them: trying again would not help
                log.error(
                    "could not log %d agent updates: %s: %s", len(items), type(exc).__name__, exc
                )
                for held in {id(h): h for h, _ in batch}.values():
                    self._fail(held, f"agent updates could not be logged ({type(exc).__name__})")
                continue
            for (held, _), result in zip(batch, results, strict=True):
                if isinstance(result, Fenced):
                    self.lose(held.session_id)
                elif isinstance(result, SessionFull):
                    self._stop_runaway(held, result)
                elif isinstance(result, Exception):
                    log.warning("update of %s not logged: %s", held.session_id, result)

    async def _log_kept(
        self, batch: list[tuple[HeldSession, JsonObject]], items: list[Any]
    ) -> list[Position | Exception]:
        """Log a batch of updates until the store takes it (:meth:`_log_until_back`) while
        the updates waiting fit; past that their sessions are failed and :class:`_Failed`
        raised."""
        return await self._log_until_back(items, lambda exc: self._keep_or_fail(exc, batch))

    async def _log_until_back(
        self,
        items: list[tuple[str, str, JsonObject, str]],
        keep: Callable[[BaseException], bool] | None = None,
    ) -> list[Position | Exception]:
        """Log ``items``, however long the store is out of reach, with the same call ids
        each time (an append whose outcome was unknown lands once); ``keep``, asked after
        each failure, may give up (False: :class:`_Failed` is raised)."""
        calls = call_ids(len(items))
        while True:
            try:
                return await self._log_retrying(items, calls)
            except STORE_AWAY as exc:
                if keep is not None and not keep(exc):
                    raise _Failed from None
            await asyncio.sleep(STORE_AWAY_PAUSE)

    def _keep_or_fail(
        self, exc: BaseException, batch: list[tuple[HeldSession, JsonObject]]
    ) -> bool:
        """Updates are waiting for a store that is away: say so once an outage, and fail the
        sessions whose updates no longer fit in ``max_pending_updates`` (False then)."""
        if not self._store_away:
            self._store_away = True
            log.warning(
                "the session store is unreachable (%s: %s): keeping %d agent updates until "
                "it is back",
                type(exc).__name__,
                exc,
                len(self._updates),
            )
        metrics.UPDATES_WAITING.set(len(batch) + len(self._updates))
        if len(batch) + len(self._updates) <= self.max_pending_updates:
            return True
        lost: dict[str, tuple[HeldSession, int]] = {}
        for held, _ in [*batch, *self._updates]:
            lost[held.session_id] = (held, lost.get(held.session_id, (held, 0))[1] + 1)
        self._updates = []
        for held, count in lost.values():
            reason = (
                f"{count} agent updates could not be logged: the session store was "
                f"unreachable for too long ({type(exc).__name__}: {exc})"
            )
            self._fail(held, reason)
        return False

    def _fail(self, held: HeldSession, reason: str) -> None:
        """Stop running a session whose updates were lost, and record it as failed."""
        log.error("session %s failed: %s", held.session_id, reason)
        self._stop_as_failed(held, reason)

    def _stop_as_failed(self, held: HeldSession, reason: str) -> None:
        """Stop running a session here, and record it as failed (ERROR, with ``reason``)
        once the store takes it, however long it is away."""
        self._drop(held)
        task = asyncio.ensure_future(self._fail_when_back(held, reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _fail_when_back(self, held: HeldSession, reason: str) -> None:
        """Record the session as failed once the store answers again (its viewers see it)."""
        pause = STORE_AWAY_PAUSE
        while True:
            try:
                await self._mark_error(held, reason)
                return
            except STORE_AWAY:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 10.0)

    async def _log_retrying(
        self, items: list[tuple[str, str, JsonObject, str]], calls: list[str] | None = None
    ) -> list[Position | Exception]:
        """Append, trying again while the store is unreachable (a failover takes a second or
        two): the same calls, so an append that did land the first time lands only once.
        Raises the last failure when the store stays out of reach."""
        calls = calls or call_ids(len(items))
        for pause in APPEND_RETRY_PAUSES:
            try:
                return self._store_back(await self.log.append_many(items, calls))
            except STORE_AWAY:
                await asyncio.sleep(pause)
        return self._store_back(await self.log.append_many(items, calls))

    def _store_back(self, results: list[Position | Exception]) -> list[Position | Exception]:
        if self._store_away:
            self._store_away = False
            metrics.UPDATES_WAITING.set(0)
            log.warning("the session store answers again: logging the agent updates kept")
        return results

    async def settle(self, agent: AgentProcess | None = None) -> None:
        """Return once every agent update received so far is in the log."""
        while self._appender is not None and not self._appender.done():
            await asyncio.shield(self._appender)

    async def on_agent_request(self, agent: AgentProcess, request: Request) -> Any:
        held = self._by_agent_sid.get((id(agent), str(request.params.get("sessionId"))))
        if held is None:
            raise session_not_found(str(request.params.get("sessionId")))
        params = {**request.params, "sessionId": held.session_id}
        waits = request.method in USER_ACTIONS and held.prompt_task is not None
        if waits:
            await self._append(held, {"type": EventType.STATE, "state": "requires_action"})
        task = asyncio.ensure_future(
            self.clients.request_client(
                held.tenant, held.session_id, request.method, params, held.prompt_origin
            )
        )
        held.client_requests.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if request.method == "session/request_permission":
                return {"outcome": {"outcome": "cancelled"}}
            raise RpcError(INTERNAL_ERROR, "the prompt was cancelled") from None
        finally:
            held.client_requests.discard(task)
            if waits and not task.cancelled() and held.prompt_task is not None:
                await self._append(held, {"type": EventType.STATE, "state": "running"})

    def on_agent_failed(self, agent: AgentProcess, reason: str) -> None:
        if self._processes.get(agent.name) is agent:
            del self._processes[agent.name]
            metrics.AGENT_PROCESSES.dec()
        for held in [h for h in self._held.values() if h.agent is agent]:
            self._stop_as_failed(held, reason)  # the process logged the failure once

    # -- internals ------------------------------------------------------------------------

    async def _process(self, name: str) -> AgentProcess:
        spec = self.specs.get(name)
        if spec is None:
            raise invalid_params(f"unknown agent {name!r}; configured: {', '.join(self.specs)}")
        lock = self._starting.setdefault(name, asyncio.Lock())
        async with lock:
            process = self._processes.get(name)
            if process is not None and not process.failed:
                return process
            process = AgentProcess(
                spec, self, request_timeout=self.request_timeout, env_allowed=self.agent_env
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

    async def _ask(
        self,
        process: AgentProcess,
        method: str,
        params: JsonObject,
        *,
        timeout: float | None = -1.0,
    ) -> JsonObject:
        try:
            result = await process.request(method, params, timeout=timeout)
        except AgentFailed as exc:
            raise RpcError(INTERNAL_ERROR, f"agent failed: {exc}") from None
        return result if isinstance(result, dict) else {}

    def _hold(
        self, tenant: str, session_id: str, process: AgentProcess, agent_sid: str, fence: str = ""
    ) -> HeldSession:
        held = HeldSession(tenant, session_id, process, agent_sid, fence)
        self._held[session_id] = held
        self._by_agent_sid[(id(process), agent_sid)] = held
        held.early.extend(self._orphans.pop((id(process), agent_sid), []))
        return held

    def _keep_orphan(self, key: tuple[int, str], body: JsonObject) -> None:
        """An update for an agent session not mapped yet: the agent can speak about a new
        session before we have read its reply to session/new. Kept (boundedly) until then."""
        if key not in self._orphans and len(self._orphans) >= _MAX_ORPHANS:
            self._orphans.pop(next(iter(self._orphans)))
        updates = self._orphans.setdefault(key, [])
        if len(updates) < _MAX_ORPHANS:
            updates.append(body)

    def _drop(self, held: HeldSession) -> None:
        if self._held.get(held.session_id) is held:
            del self._held[held.session_id]
        self._by_agent_sid.pop((id(held.agent), held.agent_session_id), None)

    async def _make_ready(self, held: HeldSession) -> None:
        held.ready = True
        early, held.early = held.early, []
        for body in early:  # queued at once, so that later updates queue behind them
            self._queue_update(held, body)
        await self.settle()

    async def _require(self, tenant: str, session_id: str, params: JsonObject) -> HeldSession:
        await self.attach(tenant, session_id, params)
        held = self._held.get(session_id)
        if held is None or held.tenant != tenant:
            raise session_not_found(session_id)
        return held

    async def _restore(self, tenant: str, session_id: str, params: JsonObject) -> JsonObject:
        try:
            snapshot = await self.log.snapshot(tenant, session_id)
        except SessionMissing:
            raise session_not_found(session_id) from None
        if snapshot.deleted:
            raise session_not_found(session_id)
        lease = await self.leases.acquire(tenant, session_id)
        try:
            return await self._restore_held(snapshot, lease.fence, params)
        except BaseException:
            await self.leases.release(tenant, session_id)
            raise

    async def _restore_held(
        self, snapshot: SessionSnapshot, fence: str, params: JsonObject
    ) -> JsonObject:
        tenant, session_id = snapshot.tenant, snapshot.session_id
        process = await self._process(snapshot.agent)
        capabilities.check_mcp_servers(
            snapshot.agent, process.capabilities, params.get("mcpServers")
        )
        base = {
            "cwd": snapshot.cwd,
            "mcpServers": params.get("mcpServers") or [],
        }
        if params.get("additionalDirectories") or snapshot.additional_directories:
            base["additionalDirectories"] = (
                params.get("additionalDirectories") or snapshot.additional_directories
            )
        base = with_trace(base, trace_fields(params))  # the client's trace context
        agent_sid = snapshot.agent_session_id or ""
        if agent_sid and (process.supports_load() or process.supports("resume")):
            method = "session/load" if process.supports_load() else "session/resume"
            held = self._hold(tenant, session_id, process, agent_sid, fence)
            held.restoring = True
            try:
                reply = await self._ask(process, method, {**base, "sessionId": agent_sid})
            except RpcError:
                self._drop(held)
                raise
            held.restoring = False
        else:
            reply = await self._ask(process, "session/new", base)
            agent_sid = str(reply.get("sessionId", ""))
            held = self._hold(tenant, session_id, process, agent_sid, fence)
            await self._append(held, _NO_RESTORE_NOTICE)
            await self._append(held, {"type": EventType.BOUND, "agentSessionId": agent_sid})
        if snapshot.prompt_id:
            await self._end_prompt(held, snapshot.prompt_id, error=_ABANDONED_PROMPT)
        if snapshot.status != Status.RUNNING:
            await self._append(held, {"type": EventType.STATUS, "status": Status.RUNNING})
        await self._make_ready(held)
        return {**reply, "sessionId": session_id}

    def _stop_runaway(self, held: HeldSession, full: SessionFull) -> None:
        """A session at ``max_events_per_session``: its viewers are told, once, and the
        running turn is cancelled (the bound leaves room for that bookkeeping)."""
        if held.session_id in self._full:
            return
        self._full.add(held.session_id)
        log.warning("session %s is full, its turn is stopped: %s", held.session_id, full)

        async def stop() -> None:
            notice = {
                "type": EventType.NOTICE,
                "severity": "error",
                "title": "This session is full",
                "text": f"{RUNAWAY_NOTICE} ({full})",
            }
            await self._append(held, notice)
            await self.cancel(held.tenant, held.session_id)

        task = asyncio.ensure_future(stop())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _append(self, held: HeldSession, body: JsonObject, *, kept: bool = False) -> Position:
        """Log one of the host's own events, after the agent's updates so far. Tried for a
        few seconds while the store is away (:meth:`_log_retrying`); ``kept``: until the
        store takes it (:meth:`_log_until_back`)."""
        await self.settle()  # the agent's updates so far go first: the log keeps their order
        items = [(held.tenant, held.session_id, body, held.fence)]
        [result] = await (self._log_until_back(items) if kept else self._log_retrying(items))
        if isinstance(result, Fenced):
            self.lose(held.session_id)
            raise RpcError(INTERNAL_ERROR, "the session moved to another agent host")
        if isinstance(result, Exception):
            raise result
        return result

    async def _end_prompt(
        self,
        held: HeldSession,
        prompt_id: str,
        *,
        result: JsonObject | None = None,
        error: JsonObject | None = None,
    ) -> Position:
        """Log the end of a prompt turn: the agent's whole result, or the error.

        Kept until the store takes it, however long it is away (its request has its own
        deadline on the front): a turn whose end never reached the log would run for ever
        to every viewer of the session, and a v2 client, answered once its prompt was
        logged, hears the end from the log only. A new prompt waits for it
        (:attr:`HeldSession.ending`), so that it does not go into the log before it."""
        body: JsonObject = {"type": EventType.PROMPT_END, "promptId": prompt_id}
        if error is not None:
            body["error"] = error
        else:
            body["stopReason"] = (result or {}).get("stopReason")
            body["result"] = result or {}
        ending = held.ending = asyncio.get_running_loop().create_future()
        try:
            return await self._append(held, body, kept=True)
        finally:
            held.ending = None
            ending.set_result(None)

    async def _mark_error(self, held: HeldSession, reason: str) -> None:
        with contextlib.suppress(SessionMissing, RpcError):
            await self._append(
                held, {"type": EventType.STATUS, "status": Status.ERROR, "reason": reason}
            )
        # No host takes an ERROR session over by itself: the next command brings it back.
        try:
            await self.leases.release(held.tenant, held.session_id)
            await self.leases.forget(held.tenant, held.session_id)
        except Exception as exc:  # the lease lapses by itself; the next command takes it over
            log.warning("could not release session %s: %s", held.session_id, describe(exc))

    def _check_cancelled(self, held: HeldSession, task: asyncio.Task[Any]) -> None:
        """An agent that ignores a cancel past the grace period hangs: fail it."""
        if held.prompt_task is task and not task.done() and not held.agent.failed:
            name, grace = held.agent.name, f"{self.cancel_grace:g}s"
            held.agent.fail(f"agent {name!r} did not end a cancelled prompt within {grace}")


def _agent_session_id(agent: str, reply: JsonObject) -> str:
    """The agent's own id for the session it made (``session/new``, ``session/fork``)."""
    agent_sid = str(reply.get("sessionId", ""))
    if not agent_sid:
        raise RpcError(INTERNAL_ERROR, f"agent {agent!r} returned no sessionId")
    return agent_sid


def _created(
    params: JsonObject, *, agent: str, kind: str, meta: JsonObject, origin: str
) -> JsonObject:
    """A new session log's first event, from the ``session/new`` (or fork) parameters."""
    return {
        "type": EventType.CREATED,
        "cwd": params["cwd"],
        "additionalDirectories": params.get("additionalDirectories") or [],
        "agent": agent,
        "kind": kind,
        "meta": meta,
        "origin": origin,
    }
