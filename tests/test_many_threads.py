"""An editor with 150 threads on one connection: every ``session/new`` succeeds (past
``max_sessions_per_connection`` the least recently used are let go), and a ``session/load``
of any of them, one the broker let go included, replays its whole history: its prompt and
its answer. Through ``acp-broker connect`` (the stdio bridge, as Zed runs it) and over the
WebSocket directly."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from .support.client import RawClient, text, wait_for
from .test_bridge_e2e import _initialize, bridged

THREADS = 150
"""Sessions the editor opens on its one connection (the bound is 100)."""
REOPENED = (0, 99, 149)
"""The threads reopened: the first (let go long ago), the 100th, the 150th (followed)."""
BOUND = 240.0
"""Seconds the whole test may take: 150 sessions made and prompted one after another, each
a demo agent's turn, on a machine other tests load (alone: about 30 s)."""


@pytest.fixture
def store_kind() -> str:
    return "redis"


def _prompt(index: int) -> str:
    return f"/notool thread {index + 1} of the editor"


async def test_150_threads_through_the_bridge_each_reopened_whole(url: str, tmp_path: Path) -> None:
    async with asyncio.timeout(BOUND):
        async with bridged(url, tmp_path) as (conn, client, _):
            await _initialize(conn)
            sessions = []
            for index in range(THREADS):
                session = await conn.new_session(cwd="/work/threads", mcp_servers=[])
                sessions.append(session.session_id)
                reply = await conn.prompt(
                    session_id=session.session_id, prompt=[_block(_prompt(index))]
                )
                assert reply.stop_reason == "end_turn"
            for index in REOPENED:
                await _reopened_whole(conn, client, sessions[index], index)


async def _reopened_whole(conn: Any, client: Any, session_id: str, index: int) -> None:
    """Load thread ``index`` through the bridge: its replay brings its prompt and answer."""
    seen = len(client.updates)
    await conn.load_session(session_id=session_id, cwd="/work/threads", mcp_servers=[])
    answer = f"You said: {_prompt(index)}"

    def replayed() -> tuple[str, str]:
        updates = [u for sid, u in client.updates[seen:] if sid == session_id]
        said = "".join(_texts(updates, "user_message_chunk"))
        return said, "".join(_texts(updates, "agent_message_chunk"))

    # The replay came before the answer; the client hands it over in its own tasks.
    await wait_for(lambda: replayed()[1] == answer, 10.0, f"thread {index + 1}'s replay")
    assert replayed() == (_prompt(index), answer)


async def test_150_threads_over_the_websocket_each_reopened_whole(url: str) -> None:
    async with asyncio.timeout(BOUND):
        client = await RawClient.connect(url)
        await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        sessions = []
        for index in range(THREADS):
            session_id = await client.new_session("/work/threads")
            sessions.append(session_id)
            prompt = {"sessionId": session_id, "prompt": text(_prompt(index))}
            reply = await client.call("session/prompt", prompt)
            assert reply["result"]["stopReason"] == "end_turn"
        for index in REOPENED:
            session_id = sessions[index]
            client.inbox.clear()
            params = {"sessionId": session_id, "cwd": "/work/threads", "mcpServers": []}
            assert "result" in await client.call("session/load", params)
            replayed = [u["update"] for u in client.updates(session_id)]
            said = "".join(_raw_texts(replayed, "user_message_chunk"))
            answered = "".join(_raw_texts(replayed, "agent_message_chunk"))
            assert said == _prompt(index), (index, said)
            assert answered == f"You said: {_prompt(index)}", (index, answered)
        await client.close()


def _block(words: str) -> Any:
    from acp import text_block

    return text_block(words)


def _texts(updates: list[Any], kind: str) -> list[str]:
    return [u.content.text for u in updates if u.session_update == kind]


def _raw_texts(updates: list[dict[str, Any]], kind: str) -> list[str]:
    return [u["content"]["text"] for u in updates if u["sessionUpdate"] == kind]
