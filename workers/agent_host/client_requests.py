"""An agent's requests to a client (permission, files, terminals), sent on to a client
connection where the session is active."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from broker.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, Request, RpcError, session_not_found
from broker.store.events import EventType

from .process import AgentProcess
from .recorder import SessionRecorder
from .sessions import HeldSessions

USER_ACTIONS = frozenset({"session/request_permission", "elicitation/create"})
"""Agent requests that block the running prompt on a person: logged as ``state`` events."""


class ClientChannel(Protocol):
    """How the host reaches a client connection where a session is active."""

    async def request_client(
        self, tenant: str, session_id: str, method: str, params: JsonObject, prefer: str | None
    ) -> Any: ...


class ClientRequests:
    """Sends an agent's requests to a client; a person's wait shows in the session's state."""

    def __init__(
        self, sessions: HeldSessions, recorder: SessionRecorder, clients: ClientChannel
    ) -> None:
        self.sessions = sessions
        self.recorder = recorder
        self.clients = clients

    async def on_agent_request(self, agent: AgentProcess, request: Request) -> Any:
        held = self.sessions.by_agent_sid.get((id(agent), str(request.params.get("sessionId"))))
        if held is None:
            raise session_not_found(str(request.params.get("sessionId")))
        params = {**request.params, "sessionId": held.session_id}
        waits = request.method in USER_ACTIONS and held.prompt_task is not None
        if waits:
            await self.recorder.append(held, {"type": EventType.STATE, "state": "requires_action"})
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
                await self.recorder.append(held, {"type": EventType.STATE, "state": "running"})
