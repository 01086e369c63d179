"""An agent's requests to a client (permission, files, terminals), sent on to a client
connection where the session is active."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from broker.protocol.interactions import KINDS
from broker.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, Request, RpcError, session_not_found

from .clients import Answered
from .interactions import HostInteractions
from .process import AgentProcess
from .recorder import SessionRecorder
from .sessions import HeldSessions


class ClientChannel(Protocol):
    """How the host reaches a client connection where a session is active."""

    timeout: float
    """How long a request waits for its answer (an interaction, before it expires)."""

    async def request_client(
        self, tenant: str, session_id: str, method: str, params: JsonObject, prefer: str | None
    ) -> Any: ...

    async def answer_client(
        self, tenant: str, session_id: str, method: str, params: JsonObject, prefer: str | None
    ) -> Answered:
        """As :meth:`request_client`, with who answered."""
        ...


class ClientRequests:
    """Sends an agent's requests to a client; a question for a person is an interaction."""

    def __init__(
        self, sessions: HeldSessions, recorder: SessionRecorder, clients: ClientChannel
    ) -> None:
        self.sessions = sessions
        self.recorder = recorder
        self.clients = clients
        self.interactions = HostInteractions(recorder, clients.timeout)

    async def on_agent_request(self, agent: AgentProcess, request: Request) -> Any:
        held = self.sessions.by_agent_sid.get((id(agent), str(request.params.get("sessionId"))))
        if held is None:
            raise session_not_found(str(request.params.get("sessionId")))
        params = {**request.params, "sessionId": held.session_id}

        def ask_clients(asked: JsonObject) -> Any:
            return self.clients.answer_client(
                held.tenant, held.session_id, request.method, asked, held.prompt_origin
            )

        if request.method in KINDS:  # a durable interaction, the person's wait in the state
            work = self.interactions.ask(held, request.method, params, ask_clients)
        else:
            work = self.clients.request_client(
                held.tenant, held.session_id, request.method, params, held.prompt_origin
            )
        task = asyncio.ensure_future(work)
        held.client_requests.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if request.method == "session/request_permission":
                return {"outcome": {"outcome": "cancelled"}}
            raise RpcError(INTERNAL_ERROR, "the prompt was cancelled") from None
        finally:
            held.client_requests.discard(task)
