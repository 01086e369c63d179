"""The sessions a host holds: each bound to an agent process and the agent's own session id."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from broker.auth.roles import Authority
from broker.protocol.jsonrpc import JsonObject
from broker.store.events import Position

from .copies import PromptCopies
from .process import AgentProcess

log = logging.getLogger(__name__)

_MAX_ORPHANS = 100


@dataclass(eq=False)
class Queued:
    """A prompt waiting its turn: its future is done when the turn is its own (None), or
    when it was withdrawn (the position of its ``prompt_withdrawn`` event)."""

    prompt_id: str
    author: str = ""
    """The principal who sent it, who alone may withdraw it (``""``: anyone may)."""
    authority: Authority | None = None
    """What its author was accepted with: checked again when its turn comes (None: the
    front sent none, nothing to check)."""
    seq: int = 0
    """Its ``prompt_queued`` event's seq (its v2 user message is named after it)."""
    turn: asyncio.Future[Position | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


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
    prompt_id: str | None = None  # the running prompt's (its activity id)
    queue: list[Queued] = field(default_factory=list)  # prompts waiting their turn, in order
    prompts: PromptCopies = field(default_factory=PromptCopies)
    """The outcomes of the prompts it took, by prompt id: a copy of one is not run again."""
    client_requests: set[asyncio.Task[Any]] = field(default_factory=set)
    interactions: dict[str, Any] = field(default_factory=dict)
    """Its pending interactions (and the last ended ones) by id: ``interactions.Pending``."""


class HeldSessions:
    """The sessions held here, by broker session id and by (agent process, agent session id);
    and the updates an agent sent about a session before its id was mapped."""

    def __init__(self) -> None:
        self.by_id: dict[str, HeldSession] = {}
        self.by_agent_sid: dict[tuple[int, str], HeldSession] = {}
        self._orphans: dict[tuple[int, str], list[JsonObject]] = {}

    def hold(
        self, tenant: str, session_id: str, process: AgentProcess, agent_sid: str, fence: str = ""
    ) -> HeldSession:
        held = HeldSession(tenant, session_id, process, agent_sid, fence)
        self.by_id[session_id] = held
        self.by_agent_sid[(id(process), agent_sid)] = held
        held.early.extend(self._orphans.pop((id(process), agent_sid), []))
        return held

    def keep_orphan(self, key: tuple[int, str], body: JsonObject) -> None:
        """An update for an agent session not mapped yet: the agent can speak about a new
        session before we have read its reply to session/new. Kept (boundedly) until then."""
        if key not in self._orphans and len(self._orphans) >= _MAX_ORPHANS:
            self._orphans.pop(next(iter(self._orphans)))
        updates = self._orphans.setdefault(key, [])
        if len(updates) < _MAX_ORPHANS:
            updates.append(body)

    def drop(self, held: HeldSession) -> None:
        if self.by_id.get(held.session_id) is held:
            del self.by_id[held.session_id]
        self.by_agent_sid.pop((id(held.agent), held.agent_session_id), None)

    def held_sessions(self) -> list[tuple[str, str]]:
        """(tenant, session id) of every session held here, for lease renewal."""
        return [(h.tenant, h.session_id) for h in self.by_id.values()]

    def fences(self) -> dict[str, str]:
        """Session id -> the fencing token this host holds it with."""
        return {h.session_id: h.fence for h in self.by_id.values()}

    def lose(self, session_id: str, *, vanished: bool = False) -> None:
        """The lease was lost (this host stalled), or the session ``vanished`` from the
        store (Redis came back without its data): stop running the session here."""
        held = self.by_id.get(session_id)
        if held is not None:
            if vanished:
                log.warning(
                    "session %s is gone from the store (Redis lost it): no longer run here",
                    session_id,
                )
            else:
                log.warning("lost the lease on session %s; another host runs it now", session_id)
            self.drop(held)

    def holds(self, session_id: str) -> bool:
        return session_id in self.by_id

    def prompt_origin(self, session_id: str) -> str | None:
        held = self.by_id.get(session_id)
        return held.prompt_origin if held else None
