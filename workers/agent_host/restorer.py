"""Bringing a session back on this host: its lease taken, its agent session loaded, resumed,
or started afresh (with a notice in the log), an abandoned prompt ended."""

from __future__ import annotations

import asyncio
import logging
import time

from broker.protocol import capabilities
from broker.protocol.interactions import cancelled_for_host_loss
from broker.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, RpcError, session_not_found
from broker.protocol.trace import trace_fields, with_trace
from broker.store.events import EventType, SessionSnapshot, Status
from broker.store.leases import Leases
from broker.store.log import SessionLog, SessionMissing

from .agents import AgentPool, ask
from .recorder import SessionRecorder
from .sessions import HeldSession, HeldSessions

log = logging.getLogger(__name__)

_NO_RESTORE_NOTICE: JsonObject = {
    "type": EventType.NOTICE,
    "severity": "warning",
    "title": "The agent started this session afresh",
    "text": (
        "The agent could not load or resume this session, so it starts afresh: it does not "
        "remember the conversation above. The broker's log still holds all of it."
    ),
}

_ABANDONED_PROMPT: JsonObject = {
    "code": INTERNAL_ERROR,
    "message": "the agent host running this prompt stopped; the session was taken over",
}


_REQUIRE_TRIES = 3
"""Times :meth:`SessionRestorer.require` brings back a session let go meanwhile."""


class SessionRestorer:
    """Makes sure this host holds a session, taking it over (from its log) when it does not."""

    def __init__(
        self,
        session_log: SessionLog,
        leases: Leases,
        agents: AgentPool,
        sessions: HeldSessions,
        recorder: SessionRecorder,
    ) -> None:
        self.log = session_log
        self.leases = leases
        self.agents = agents
        self.sessions = sessions
        self.recorder = recorder
        self._restore_locks: dict[str, asyncio.Lock] = {}

    async def attach(self, tenant: str, session_id: str, params: JsonObject) -> JsonObject:
        """Make sure an agent holds the session (for load/resume/prompt); returns the agent's reply
        to the call that restored it ({} when it was held already)."""
        if session_id in self.sessions.by_id:
            return {}
        lock = self._restore_locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            if session_id in self.sessions.by_id:
                return {}
            return await self._restore(tenant, session_id, params)

    async def require(self, tenant: str, session_id: str, params: JsonObject) -> HeldSession:
        """The session, held here (brought back first if need be). One let go again while
        it was brought back is brought back again: its agent's first updates refused by a
        full store (the stopper drops it), or its lease lost. It exists all the same, so
        it is never "not found" for that: the next try meets the store's refusal itself
        (``store_full`` when its lease cannot be written), or holds it."""
        for _ in range(_REQUIRE_TRIES):
            await self.attach(tenant, session_id, params)
            held = self.sessions.by_id.get(session_id)
            if held is not None:
                if held.tenant != tenant:
                    raise session_not_found(session_id)  # another tenant's: none of this one's
                return held
            log.info("session %s was let go as it was brought back: brought back again", session_id)
        raise RpcError(
            INTERNAL_ERROR, f"session {session_id} stopped each time it was brought back; try again"
        )

    async def _restore(self, tenant: str, session_id: str, params: JsonObject) -> JsonObject:
        try:
            snapshot = await self.recorder.log.snapshot(tenant, session_id)
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
        base = {
            "cwd": snapshot.cwd,
            "mcpServers": params.get("mcpServers") or [],
        }
        extra = params.get("additionalDirectories") or snapshot.additional_directories
        if extra:
            base["additionalDirectories"] = extra
        dirs = [snapshot.cwd, *(extra or [])]
        process = await self.agents.process(snapshot.agent, tenant, dirs, session_id)
        capabilities.check_mcp_servers(
            snapshot.agent, process.capabilities, params.get("mcpServers")
        )
        base = with_trace(base, trace_fields(params))  # the client's trace context
        agent_sid = snapshot.agent_session_id or ""
        if agent_sid and (process.supports_load() or process.supports("resume")):
            method = "session/load" if process.supports_load() else "session/resume"
            held = self.sessions.hold(tenant, session_id, process, agent_sid, fence)
            held.restoring = True
            try:
                reply = await ask(process, method, {**base, "sessionId": agent_sid})
            except RpcError:
                self.sessions.drop(held)
                raise
            held.restoring = False
        else:
            reply = await ask(process, "session/new", base)
            agent_sid = str(reply.get("sessionId", ""))
            held = self.sessions.hold(tenant, session_id, process, agent_sid, fence)
            await self.recorder.append(held, _NO_RESTORE_NOTICE)
            await self.recorder.append(held, {"type": EventType.BOUND, "agentSessionId": agent_sid})
        if snapshot.interactions:
            await self._cancel_stranded(held, snapshot)
        if snapshot.prompt_id:
            await self.recorder.end_prompt(held, snapshot.prompt_id, error=_ABANDONED_PROMPT)
        if snapshot.status != Status.RUNNING:
            await self.recorder.append(held, {"type": EventType.STATUS, "status": Status.RUNNING})
        await self.recorder.log_window(held, reply)
        await self.recorder.make_ready(held)
        return {**reply, "sessionId": session_id}

    async def _cancel_stranded(self, held: HeldSession, snapshot: SessionSnapshot) -> None:
        """The interactions the lost host left pending end ``cancelled``: the agent that
        asked died with it, so no answer can reach it; logged (before the abandoned turn's
        end) so every attachment sees the question end rather than wait on it forever.
        Read again now that this host's lease fences the lost one out: what it wrote before
        (an answer) counts, nothing after does."""
        now = time.time()
        current = await self.recorder.log.snapshot(snapshot.tenant, snapshot.session_id)
        ended = [
            {"type": EventType.INTERACTION, "interaction": cancelled_for_host_loss(view, now)}
            for view in current.interactions
        ]
        if not ended:
            return
        await self.recorder.append_all(held, ended)
        log.info(
            "session %s: %d interaction(s) its lost host left pending cancelled",
            held.session_id, len(ended),
        )  # fmt: skip
