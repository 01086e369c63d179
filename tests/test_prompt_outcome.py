"""``_acpBroker/prompt_outcome``: a named prompt's answer, asked on another connection
(what the stdio bridge does after a drop), in v1 (the turn's end) and v2 (``messageId``)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.front.acp import turn_outcome
from broker.protocol.turns import PROMPT_ID_META, PROMPT_OUTCOME

from .support.client import RawClient, text

CWD = "/work/outcome"


async def _resumed(url: str, session_id: str, version: int) -> RawClient:
    client = await RawClient.connect(url)
    caps = "clientCapabilities" if version == 1 else "capabilities"
    await client.call("initialize", {"protocolVersion": version, caps: {}})
    reply = await client.call(
        "session/resume", {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
    )
    assert "result" in reply, reply
    return client


def _named(session_id: str, words: str, prompt_id: str) -> dict[str, Any]:
    meta = {PROMPT_ID_META: prompt_id}
    return {"sessionId": session_id, "prompt": text(words), "_meta": meta}


async def test_a_v1_prompt_is_answered_on_another_connection_with_its_real_end(
    url: str,
) -> None:
    first = await RawClient.initialized(url)
    session_id = await first.new_session(CWD)
    await first.send(
        {
            "jsonrpc": "2.0",
            "id": "p",
            "method": "session/prompt",
            "params": _named(session_id, "/slow 5", "turn-1"),
        }
    )
    await first.read_chunks(session_id, 1, timeout=20)
    second = await _resumed(url, session_id, 1)
    outcome = await second.call(
        PROMPT_OUTCOME, {"sessionId": session_id, "promptId": "turn-1"}, timeout=30
    )
    assert outcome["result"]["stopReason"] == "end_turn"
    # Every update of the turn reached the asking connection before the answer.
    assert second.chunks(session_id)[-1] == "chunk 5"
    # Asked once the turn has ended: the same answer, from the log.
    again = await second.call(PROMPT_OUTCOME, {"sessionId": session_id, "promptId": "turn-1"})
    assert again["result"] == outcome["result"]
    for client in (first, second):
        await client.close()


async def test_a_v2_prompt_is_answered_with_its_message_id(url: str) -> None:
    first = await RawClient.connect(url)
    await first.call("initialize", {"protocolVersion": 2, "capabilities": {}})
    session_id = await first.new_session(CWD)
    reply = await first.call("session/prompt", _named(session_id, "/notool hi", "turn-2"))
    second = await _resumed(url, session_id, 2)
    outcome = await second.call(PROMPT_OUTCOME, {"sessionId": session_id, "promptId": "turn-2"})
    assert outcome["result"] == reply["result"]
    for client in (first, second):
        await client.close()


async def test_a_prompt_that_never_reached_the_log_is_said_lost(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turn_outcome, "LOST_GRACE", 0.2)
    client = await RawClient.initialized(url)
    session_id = await client.new_session(CWD)
    lost = await client.call(PROMPT_OUTCOME, {"sessionId": session_id, "promptId": "never"})
    assert lost["error"]["code"] == -32603 and "send it again" in lost["error"]["message"]
    elsewhere = await client.call(
        PROMPT_OUTCOME, {"sessionId": "sess_" + "0" * 32, "promptId": "x"}
    )
    assert elsewhere["error"]["code"] == -32002  # not active here
    await client.close()
