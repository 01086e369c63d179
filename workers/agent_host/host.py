"""The agent host: runs agents, holds sessions, executes commands for them.

The host keeps a process per agent and tenant, sealed (:class:`AgentPool`) and maps broker
session ids to the agent's own session ids, which never leave it (:class:`HeldSessions`).
Everything an agent says about a session is appended to the session's log
(:class:`SessionRecorder`); agent-to-client requests go to a client connection through a
:class:`ClientChannel` (:class:`ClientRequests`). A session whose process is gone is
brought back on demand (:class:`SessionRestorer`: ``session/load``, else ``session/resume``,
else a fresh agent session with a notice in the log); one that fails or fills up is stopped
(:class:`SessionStopper`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from broker.auth.roles import Authority, Permission, acl_entries
from broker.config import DEFAULT_AGENT_ENV, AgentSpec
from broker.errors.failures import describe
from broker.protocol import capabilities
from broker.protocol.commands import PromptOutcome
from broker.protocol.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, JsonObject, Request, RpcError
from broker.protocol.turns import QUEUED_SEQ, WITHDRAWN
from broker.store.events import EventType, Status
from broker.store.leases import Leases
from broker.store.log import SessionLog, new_session_id

from . import queue
from .agents import AgentPool, ask
from .client_requests import ClientChannel, ClientRequests
from .process import AgentEvents, AgentFailed, AgentProcess
from .reaper import IdleReaper
from .recorder import SessionRecorder
from .restorer import SessionRestorer
from .sandbox import SandboxPolicy
from .sessions import HeldSession, HeldSessions, Queued
from .stopper import SessionStopper

log = logging.getLogger(__name__)


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
        sandbox: SandboxPolicy | None = None,
        idle_timeout: float | None = None,
        max_processes: int | None = None,
    ) -> None:
        self.log = session_log
        self.leases = leases
        self.cancel_grace = cancel_grace
        self.agents = AgentPool(
            agents,
            self,
            request_timeout=request_timeout,
            agent_env=agent_env,
            on_agent_started=on_agent_started,
            sandbox=sandbox,
            max_processes=max_processes,
        )
        self.sessions = HeldSessions()
        self.recorder = SessionRecorder(
            session_log, self.sessions, max_pending_updates=max_pending_updates
        )
        self.stopper = SessionStopper(self.sessions, self.recorder, leases, self.cancel)
        self.recorder.stopper = self.stopper
        self.restorer = SessionRestorer(
            session_log, leases, self.agents, self.sessions, self.recorder
        )
        self.requests = ClientRequests(self.sessions, self.recorder, clients)
        self.reaper = IdleReaper(self.agents, self.sessions, self.stop_session, idle_timeout)

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
        session_id = new_session_id()
        dirs = [params["cwd"], *(params.get("additionalDirectories") or [])]
        process = await self.agents.process(agent, tenant, dirs, session_id)
        capabilities.check_mcp_servers(agent, process.capabilities, params.get("mcpServers"))
        reply = await ask(process, "session/new", params)
        agent_sid = _agent_session_id(agent, reply)
        held = self.sessions.hold(tenant, session_id, process, agent_sid)
        try:
            await self.log.create(
                tenant,
                session_id,
                _created(params, agent=agent, kind=kind, meta=meta, origin=origin),
            )
            held.fence = (await self.leases.acquire(tenant, session_id)).fence
        except BaseException:
            # Not held without its log and its lease (the store away at this moment fails
            # the request): the lease upkeep would say the store lost it, or another host
            # took it.
            self.sessions.drop(held)
            raise
        await self.recorder.append(held, {"type": EventType.BOUND, "agentSessionId": agent_sid})
        await self.recorder.log_window(held, reply)
        await self.recorder.make_ready(held)
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
        held = await self.restorer.require(tenant, parent_id, {})
        agent = held.agent
        capabilities.check_session(agent.name, agent.capabilities, "fork", "session/fork")
        capabilities.check_mcp_servers(agent.name, agent.capabilities, params.get("mcpServers"))
        await self.recorder.settle()
        parent = await self.log.snapshot(tenant, parent_id)
        if parent.prompt_id is not None or held.prompt_task is not None:
            raise RpcError(INVALID_REQUEST, "a prompt is running in this session: fork it after")
        history = await self.log.read(tenant, parent_id, until=parent.seq, epoch=parent.epoch)
        fork = {**params, "sessionId": held.agent_session_id}
        reply = await ask(agent, "session/fork", fork)
        agent_sid = _agent_session_id(agent.name, reply)
        session_id = new_session_id()
        child = self.sessions.hold(tenant, session_id, agent, agent_sid)
        created = history[0].body if history else {}
        body = _created(
            params,
            agent=parent.agent,
            kind=parent.kind,
            meta={**(created.get("meta") or {}), **meta},
            origin=origin,
        )
        body["forkedFrom"] = {"sessionId": parent_id, "seq": parent.seq}
        try:
            await self.log.create(tenant, session_id, body)
            child.fence = (await self.leases.acquire(tenant, session_id)).fence
        except BaseException:
            self.sessions.drop(child)  # as in new_session
            raise
        copied = await self.recorder.copy_history(child, [e.body for e in history])
        await self.recorder.append(child, {"type": EventType.BOUND, "agentSessionId": agent_sid})
        await self.recorder.log_window(child, reply)
        await self.recorder.make_ready(child)
        return session_id, {**reply, "sessionId": session_id}, copied

    async def prompt(
        self,
        tenant: str,
        session_id: str,
        params: JsonObject,
        origin: str,
        prompt_id: str | None = None,
        author: str = "",
        authority: Authority | None = None,
    ) -> PromptOutcome:
        """Run one prompt turn; the log records the prompt, every update and the outcome.
        Sent while a turn runs, it waits its turn (:mod:`.queue`); ``author`` alone may
        withdraw it then, and ``authority`` (what its author was accepted with) must still
        allow ``session.write`` when its turn comes. A copy of a prompt this session took
        already (the same ``prompt_id``) is not run again: it gets the first's outcome
        (:mod:`.copies`)."""
        held = await self.restorer.require(tenant, session_id, params)
        capabilities.check_prompt(held.agent.name, held.agent.capabilities, params.get("prompt"))
        prompt_id = prompt_id or secrets.token_hex(8)
        first = held.prompts.first(prompt_id)
        if first is not None:  # a copy of a prompt taken already (see .copies)
            log.info("prompt %s was taken already: its copy gets its outcome", prompt_id)
            return await asyncio.shield(first)
        try:
            outcome = await self._prompt(held, params, origin, prompt_id, author, authority)
        except BaseException as exc:
            held.prompts.settle(prompt_id, exc)
            raise
        held.prompts.settle(prompt_id, outcome)
        return outcome

    async def _prompt(
        self,
        held: HeldSession,
        params: JsonObject,
        origin: str,
        prompt_id: str,
        author: str,
        authority: Authority | None,
    ) -> PromptOutcome:
        """The first copy of a prompt: run now, or once its turn comes."""
        queued_seq = None
        if queue.busy(held):  # a turn runs: this one waits its turn (see .queue)
            entry = await queue.enter(
                held, self.recorder, prompt_id, origin, params, author, authority
            )
            withdrawn = entry.turn.result()
            if withdrawn is None and not await self._may_commit(held, entry):
                withdrawn = await queue.revoked(held, self.recorder, entry)
            if withdrawn is not None:  # cancelled before its turn
                return PromptOutcome(dict(WITHDRAWN), withdrawn)
            held.queue.remove(entry)
            queued_seq = entry.seq
        # Claimed in the step that found the session free: a prompt arriving from here on
        # queues behind this one.
        held.prompt_task = asyncio.current_task()
        held.prompt_origin, held.prompt_id = origin, prompt_id
        try:
            return await self._turn(held, params, origin, prompt_id, queued_seq)
        finally:
            held.prompt_task = None
            held.prompt_origin = held.prompt_id = None
            queue.wake_next(held)

    async def _may_commit(self, held: HeldSession, entry: Queued) -> bool:
        """Whether ``entry``'s author may still prompt the session, its turn come: a revoke
        since it was accepted fences it (the session's ACL as it is now, with the roles and
        scopes its credential had then). It stays first in the queue meanwhile."""
        if entry.authority is None:
            return True
        try:
            snapshot = await self.log.snapshot(held.tenant, held.session_id)
        except BaseException:
            queue.leave(held, entry)
            raise
        entries = acl_entries(snapshot.acl.values())
        return entry.authority.allows(entries, Permission.WRITE, time.time())

    async def _turn(
        self,
        held: HeldSession,
        params: JsonObject,
        origin: str,
        prompt_id: str,
        queued_seq: int | None,
    ) -> PromptOutcome:
        """The turn of a prompt that has the session: logged, asked of the agent, ended."""
        while held.ending is not None:  # the previous turn's end goes into the log first
            await asyncio.shield(held.ending)
        body: JsonObject = {
            "type": EventType.PROMPT,
            "promptId": prompt_id,
            "origin": origin,
            "prompt": params.get("prompt", []),
        }
        if queued_seq is not None:  # its user message was named when it was queued
            body[QUEUED_SEQ] = queued_seq
        await self.recorder.append(held, body)
        try:
            result = await ask(
                held.agent,
                "session/prompt",
                {**params, "sessionId": held.agent_session_id},
                timeout=None,
            )
        except RpcError as exc:
            await self.recorder.end_prompt(held, prompt_id, error=exc.to_json())
            raise
        position = await self.recorder.end_prompt(held, prompt_id, result=result)
        return PromptOutcome(result, position)

    async def cancel(
        self, tenant: str, session_id: str, activity_id: str | None = None, origin: str = ""
    ) -> None:
        """Cancel the running prompt: tell the agent, settle its pending client requests.
        ``activity_id``: only that prompt's turn; one still queued is withdrawn (by its
        author: ``origin`` names the principal cancelling), one that ended is a logged
        no-op (see :mod:`.queue`)."""
        held = self.sessions.by_id.get(session_id)
        if held is None or held.tenant != tenant:
            return
        if activity_id is not None and activity_id != held.prompt_id:
            await queue.withdraw(held, self.recorder, activity_id, origin)
            return
        for task in list(held.client_requests):
            task.cancel()
        with contextlib.suppress(AgentFailed):
            await held.agent.notify("session/cancel", {"sessionId": held.agent_session_id})
        if held.prompt_task is not None:
            asyncio.get_running_loop().call_later(
                self.cancel_grace, self._check_cancelled, held, held.prompt_task
            )

    async def fence(self, tenant: str, session_id: str) -> None:
        """The session's ACL lost entries: claims held without ``session.approve`` now reopen
        (:meth:`.interactions.HostInteractions.fence`)."""
        held = self.sessions.by_id.get(session_id)
        if held is None or held.tenant != tenant or not held.interactions:
            return
        snapshot = await self.log.snapshot(tenant, session_id)
        await self.requests.interactions.fence(held, acl_entries(snapshot.acl.values()))

    async def forward(self, tenant: str, session_id: str, method: str, params: JsonObject) -> Any:
        """Pass a session request (set_mode, set_config_option) to the agent that holds it."""
        held = await self.restorer.require(tenant, session_id, {})
        reply = await ask(held.agent, method, {**params, "sessionId": held.agent_session_id})
        mode_id = params.get("modeId") if method == "session/set_mode" else None
        await self.recorder.log_window(
            held, reply, mode_id=mode_id if isinstance(mode_id, str) else None
        )
        return reply

    async def close(self, tenant: str, session_id: str, origin: str) -> None:
        """A connection closed the session: cancel the prompt it started, if one runs."""
        held = self.sessions.by_id.get(session_id)
        if held is not None and held.tenant == tenant and held.prompt_origin == origin:
            await self.cancel(tenant, session_id)

    async def release(self, tenant: str, session_id: str) -> None:
        """Stop holding the session (deleted, stopped): cancel its work (the prompts waiting
        in its queue fail), close it in the agent."""
        held = self.sessions.by_id.get(session_id)
        if held is None or held.tenant != tenant:
            return
        queue.fail_all(held, RpcError(INVALID_REQUEST, _LET_GO))
        await self.cancel(tenant, session_id)
        self.sessions.drop(held)
        await self.leases.release(tenant, session_id)
        await self.leases.forget(tenant, session_id)
        if held.agent.supports("close"):
            with contextlib.suppress(AgentFailed, RpcError):
                await held.agent.request("session/close", {"sessionId": held.agent_session_id})

    async def stop_session(self, tenant: str, session_id: str) -> None:
        """Let the session's agent process go, recorded ``STOPPED`` (``session_stop``): its
        turn is cancelled, the lease given up and untracked (no host takes it over by
        itself); its log stays whole, and a resume or a load brings it back."""
        held = self.sessions.by_id.get(session_id)
        if held is None or held.tenant != tenant:
            return
        await self.cancel(tenant, session_id)
        await self.recorder.append(held, {"type": EventType.STATUS, "status": Status.STOPPED})
        await self.release(tenant, session_id)

    async def stop(self, *, hand_over: bool = False) -> None:
        """Stop every agent. Held sessions are recorded as STOPPED, or, with ``hand_over``,
        left RUNNING for another agent host to take over at once."""
        for held in list(self.sessions.by_id.values()):
            self.sessions.drop(held)
            try:
                if not hand_over:
                    await self.recorder.append(
                        held, {"type": EventType.STATUS, "status": Status.STOPPED}
                    )
                await self.leases.release(held.tenant, held.session_id, hand_over=hand_over)
            except Exception as exc:  # the others are stopped still; this lease lapses by itself
                log.warning(
                    "could not record session %s as stopped: %s", held.session_id, describe(exc)
                )
        await self.reaper.stop()
        await self.agents.stop()

    async def attach(self, tenant: str, session_id: str, params: JsonObject) -> JsonObject:
        """Make sure an agent holds the session (:meth:`SessionRestorer.attach`)."""
        return await self.restorer.attach(tenant, session_id, params)

    def kind_of(self, agent: str) -> str:
        return self.agents.kind_of(agent)

    async def start(self, *, prestart: bool = True) -> None:
        """Start stopping idle processes; with ``prestart``, start every configured agent
        once now, so a broken command or a sandbox that cannot start shows at start-up (and
        say how agents are sealed)."""
        self.reaper.start()
        await self.agents.start(prestart=prestart)

    def held_sessions(self) -> list[tuple[str, str]]:
        """(tenant, session id) of every session held here, for lease renewal."""
        return self.sessions.held_sessions()

    def fences(self) -> dict[str, str]:
        """Session id -> the fencing token this host holds it with."""
        return self.sessions.fences()

    def lose(self, session_id: str, *, vanished: bool = False) -> None:
        """The lease was lost (this host stalled), or the session ``vanished`` from the
        store (Redis came back without its data): stop running the session here."""
        self.sessions.lose(session_id, vanished=vanished)

    def holds(self, session_id: str) -> bool:
        return self.sessions.holds(session_id)

    def prompt_origin(self, session_id: str) -> str | None:
        return self.sessions.prompt_origin(session_id)

    def agent_pid(self, name: str) -> int | None:
        return self.agents.agent_pid(name)

    # -- agent events ---------------------------------------------------------------------

    async def on_agent_notification(self, agent: AgentProcess, request: Request) -> None:
        if request.method != "session/update":
            return
        key = (id(agent), str(request.params.get("sessionId")))
        held = self.sessions.by_agent_sid.get(key)
        update = request.params.get("update")
        if not isinstance(update, dict) or (held is not None and held.restoring):
            return
        body: JsonObject = {"type": EventType.UPDATE, "update": update}
        if held is None:
            self.sessions.keep_orphan(key, body)
        elif held.ready:
            self.recorder.queue_update(held, body)
        else:
            held.early.append(body)

    def on_agent_failed(self, agent: AgentProcess, reason: str) -> None:
        self.agents.forget(agent)
        for held in [h for h in self.sessions.by_id.values() if h.agent is agent]:
            self.stopper.stop_as_failed(held, reason)  # the process logged the failure once

    async def settle(self, agent: AgentProcess | None = None) -> None:
        """Return once every agent update received so far is in the log."""
        await self.recorder.settle()

    async def on_agent_request(self, agent: AgentProcess, request: Request) -> Any:
        return await self.requests.on_agent_request(agent, request)

    def _check_cancelled(self, held: HeldSession, task: asyncio.Task[Any]) -> None:
        """An agent that ignores a cancel past the grace period hangs: fail it."""
        if held.prompt_task is task and not task.done() and not held.agent.failed:
            name, grace = held.agent.name, f"{self.cancel_grace:g}s"
            held.agent.fail(f"agent {name!r} did not end a cancelled prompt within {grace}")


_LET_GO = "the session was stopped or deleted before this prompt's turn came"


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
