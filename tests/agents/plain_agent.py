"""A deliberately minimal ACP agent for tests: no session/load, resume or close.

Run it as ``python tests/agents/plain_agent.py``. ``session/new`` returns ``plain_<hex>``;
each prompt is answered with two ``agent_message_chunk`` updates, ``"plain:"`` and the
prompt text, then ``end_turn``. The prompt ``/trace`` is answered with the W3C trace
context (``_meta.traceparent``/``tracestate``) its ``session/new`` and itself carried.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any, cast

from acp import PROTOCOL_VERSION, run_agent, update_agent_message_text
from acp.interfaces import Agent, Client
from acp.schema import (
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    TextContentBlock,
)


class PlainAgent:
    """Implements only initialize, session/new and session/prompt."""

    _conn: Client

    def __init__(self) -> None:
        self._traces: dict[str, str] = {}

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(load_session=False),
            agent_info=Implementation(name="plain-test-agent", version="0.1.0"),
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        session_id = f"plain_{uuid.uuid4().hex}"
        self._traces[session_id] = _trace(kwargs)
        return NewSessionResponse(session_id=session_id)

    async def prompt(self, session_id: str, prompt: Sequence[Any], **kwargs: Any) -> PromptResponse:
        text = "\n".join(block.text for block in prompt if isinstance(block, TextContentBlock))
        if text == "/trace":
            text = f"new={self._traces.get(session_id)} prompt={_trace(kwargs)}"
        for chunk in ("plain:", text):
            await self._conn.session_update(session_id, update_agent_message_text(chunk))
        return PromptResponse(stop_reason="end_turn")


def _trace(fields: dict[str, Any]) -> str:
    return f"{fields.get('traceparent')};{fields.get('tracestate')}"


if __name__ == "__main__":
    asyncio.run(run_agent(cast(Agent, PlainAgent())))
