"""A broker process dies (SIGKILL) or stops (SIGTERM) mid-session; a new one on the same Redis
carries on: the session is listed with its title, ``session/load`` replays everything, a new
prompt streams a reply, and list cursors signed by the old process still work. A session
that was mid-prompt when the broker went keeps every chunk its client saw and takes new prompts.

The brokers are real ``acp-broker serve`` subprocesses (tests/support/broker_process.py) on a
real Redis server; the demo agent keeps its own history in ``ACP_DEMO_STATE_DIR`` so the new
process's agent can ``session/load`` it. The plain agent (tests/agents/plain_agent.py) can
neither load nor resume: the broker starts it afresh and says so in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from broker.store.client import connect

from .support.broker_process import DEMO_AGENT, PLAIN_AGENT, BrokerProcess, broker_process
from .support.client import AcpTestClient, acp_client, wait_for
from .support.projection import feeds_of, until_consumed

PAGE_SIZE = 2
# Agents start on first use: a test pays only for the agents it uses.
ENV = {
    "ACP_BROKER_LIST_PAGE_SIZE": str(PAGE_SIZE),
    "ACP_BROKER_PRESTART_AGENTS": "false",
    # A dead node's sessions are taken over once their leases lapse: keep that short.
    "ACP_BROKER_LEASE_TTL": "2",
}
TEST_TIMEOUT = 40.0
NOTICE_META = "acpBroker/notice"

STOPS = pytest.mark.parametrize("stop", ["kill", "terminate"])


async def _stop(node: BrokerProcess, how: str) -> None:
    if how == "kill":
        await node.kill()
    else:
        status = await node.terminate()
        assert status == 0, f"graceful stop exited with {status}:\n{node.log_text()[-3000:]}"
    assert not node.running


async def _walk(client: AcpTestClient, cwd: str | None = None) -> list[Any]:
    """Every session of a listing, page by page (bounded)."""
    sessions: list[Any] = []
    cursor = None
    for _ in range(100):
        page = await client.conn.list_sessions(cwd=cwd, cursor=cursor)
        assert len(page.sessions) <= PAGE_SIZE
        sessions.extend(page.sessions)
        cursor = page.next_cursor
        if cursor is None:
            return sessions
    raise AssertionError("the listing never ended")


async def _until_indexed(redis_url: str, session_ids: list[str]) -> None:
    """Wait (bounded) until the projectors have indexed every event of the sessions so far."""
    redis = connect(redis_url)
    try:
        await until_consumed(redis, feeds_of("default", session_ids))
    finally:
        await redis.aclose()


def _chunks(client: AcpTestClient, session_id: str) -> list[str]:
    return [
        u.content.text
        for sid, u in client.client.updates
        if sid == session_id and u.session_update == "agent_message_chunk"
    ]


def _dumps(updates: list[Any]) -> list[dict[str, Any]]:
    return [u.model_dump(by_alias=True, exclude_none=True) for u in updates]


def _both_agents(tmp_path: Path) -> dict[str, Any]:
    """broker_process's options for a broker with the demo and the plain agent."""
    return {
        "state_dir": tmp_path / "demo-state",
        "env": ENV,
        "agents": (DEMO_AGENT, PLAIN_AGENT),
    }


@STOPS
async def test_demo_session_survives_a_broker_restart(
    stop: str, redis_url: str, tmp_path: Path
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        await _demo_restart(stop, redis_url, tmp_path)


async def _demo_restart(stop: str, redis_url: str, tmp_path: Path) -> None:
    options = _both_agents(tmp_path)
    async with broker_process(redis_url, log_path=tmp_path / "broker1.log", **options) as first:
        client = await acp_client(first.url)
        session_id = await client.new(cwd="/work/restart")
        # Other sessions, so that the listing has more than one page.
        others = [await client.new(cwd=f"/work/other{i}") for i in range(3)]
        reply = await client.prompt(session_id, "hello restart")
        assert reply.stop_reason == "end_turn"
        reply = await client.prompt(session_id, "/notool second prompt")
        assert reply.stop_reason == "end_turn"
        live = [u for sid, u in client.client.updates if sid == session_id]
        live_kinds = [u.session_update for u in live]
        assert {"agent_message_chunk", "tool_call", "session_info_update"} <= set(live_kinds)
        assert len(client.client.permission_requests) == 1

        before = await _walk(client)
        assert {s.session_id for s in before} == {session_id, *others}
        [info] = [s for s in before if s.session_id == session_id]
        assert info.title == "hello restart"
        first_page = await client.conn.list_sessions()
        assert len(first_page.sessions) == PAGE_SIZE and first_page.next_cursor
        cursor = first_page.next_cursor

        # One more session, in the middle of a prompt when the broker goes.
        midway = await client.new(cwd="/work/midprompt")
        turn = asyncio.ensure_future(client.prompt(midway, "/slow 100"))
        await wait_for(lambda: len(_chunks(client, midway)) >= 3, what="three slow chunks")
        await _stop(first, stop)
        seen_midway = _chunks(client, midway)
        # The client's prompt request fails (its connection is gone); it does not hang.
        with pytest.raises(Exception):  # noqa: B017 - whatever the acp client raises
            await asyncio.wait_for(turn, 10)
        with contextlib.suppress(Exception):
            await client.close()

    async with broker_process(redis_url, log_path=tmp_path / "broker2.log", **options) as second:
        assert second.port != 0
        client = await acp_client(second.url)

        # session/list still knows the session and its title.
        after = await _walk(client)
        assert {s.session_id for s in after} == {session_id, *others, midway}
        [info] = [s for s in after if s.session_id == session_id]
        assert info.title == "hello restart"
        assert info.cwd == "/work/restart"

        # A cursor signed by the first process is accepted by the second.
        rest = await client.conn.list_sessions(cursor=cursor)
        first_ids = [s.session_id for s in first_page.sessions]
        rest_ids = [s.session_id for s in rest.sessions]
        assert not set(rest_ids) & set(first_ids)
        if stop == "kill":
            # Nothing changed in between, so the walk goes on exactly where it stopped.
            assert rest_ids == [s.session_id for s in before][PAGE_SIZE : 2 * PAGE_SIZE]

        # session/load replays everything the first client saw, plus the user's messages.
        await client.conn.load_session(session_id=session_id, cwd="/work/restart", mcp_servers=[])
        replayed = [u for sid, u in client.client.updates if sid == session_id]
        from_agent = [u for u in replayed if u.session_update != "user_message_chunk"]
        assert [u.session_update for u in from_agent] == live_kinds
        assert _dumps(from_agent) == _dumps(live)
        user_texts = [u.content.text for u in replayed if u.session_update == "user_message_chunk"]
        assert user_texts == ["hello restart", "/notool second prompt"]

        # A new prompt works: the second process's agent took the session over.
        seen = len(client.client.updates)
        reply = await client.prompt(session_id, "after the restart")
        assert reply.stop_reason == "end_turn"
        new = [u for sid, u in client.client.updates[seen:] if sid == session_id]
        text = "".join(u.content.text for u in new if u.session_update == "agent_message_chunk")
        assert text == "You said: after the restart"
        assert "tool_call" in [u.session_update for u in new]
        assert len(client.client.permission_requests) == 1  # the round trip works again
        # Titled once, by the first prompt: the restored agent does not title it again.
        assert "session_info_update" not in [u.session_update for u in new]
        listed = await _walk(client, cwd="/work/restart")
        assert [(s.session_id, s.title) for s in listed] == [(session_id, "hello restart")]

        # The session that was mid-prompt: every chunk its client saw is in the log (the log
        # may hold a few more), and it takes new prompts.
        await client.conn.load_session(session_id=midway, cwd="/work/midprompt", mcp_servers=[])
        replayed_midway = _chunks(client, midway)
        assert replayed_midway[: len(seen_midway)] == seen_midway
        assert replayed_midway == [f"chunk {i}" for i in range(1, len(replayed_midway) + 1)]
        reply = await client.prompt(midway, "/chunks 2")
        assert reply.stop_reason == "end_turn"
        assert _chunks(client, midway)[-2:] == ["chunk 1", "chunk 2"]
        await client.close()


@STOPS
async def test_plain_agent_session_starts_afresh_after_a_restart(
    stop: str, redis_url: str, tmp_path: Path
) -> None:
    async with asyncio.timeout(TEST_TIMEOUT):
        await _plain_restart(stop, redis_url, tmp_path)


async def _plain_restart(stop: str, redis_url: str, tmp_path: Path) -> None:
    options = _both_agents(tmp_path)
    async with broker_process(redis_url, log_path=tmp_path / "broker1.log", **options) as first:
        client = await acp_client(first.url)
        session_id = await client.new("/work/plain", agent="plain")
        await client.prompt(session_id, "ping")
        assert client.client.texts(session_id) == "plain:ping"
        live = [u for sid, u in client.client.updates if sid == session_id]
        await client.close()
        await _stop(first, stop)

    async with broker_process(redis_url, log_path=tmp_path / "broker2.log", **options) as second:
        client = await acp_client(second.url)
        listed = await _walk(client)
        assert [s.session_id for s in listed] == [session_id]

        await client.conn.load_session(session_id=session_id, cwd="/work/plain", mcp_servers=[])
        replayed = [u for sid, u in client.client.updates if sid == session_id]
        kinds = [u.session_update for u in replayed]
        assert kinds[0] == "user_message_chunk" and replayed[0].content.text == "ping"
        notices = [
            u
            for u in replayed
            if u.session_update == "agent_message_chunk" and (u.field_meta or {}).get(NOTICE_META)
        ]
        assert len(notices) == 1, kinds
        assert "afresh" in notices[0].content.text
        # Everything else is exactly what the first client saw, in order.
        rest = [u for u in replayed[1:] if u is not notices[0]]
        assert _dumps(rest) == _dumps(live)
        assert replayed[-1] is notices[0]  # the notice comes after the old conversation

        seen = len(client.client.updates)
        reply = await client.prompt(session_id, "pong")
        assert reply.stop_reason == "end_turn"
        new = [u for sid, u in client.client.updates[seen:] if sid == session_id]
        assert "".join(u.content.text for u in new) == "plain:pong"
        await client.close()


async def test_graceful_restart_keeps_the_listing_as_it_was(redis_url: str, tmp_path: Path) -> None:
    """A broker stopping is no activity in any session: ``updatedAt`` ("the last activity in
    the session", acp-v2-session-list) and the newest-first order stay as they were.

    Every logged event moves ``updatedAt``, so a graceful stop must not log anything to the
    sessions it held (a STOPPED status on each, say), or every restart reorders the list.
    """
    stop = "terminate"
    async with asyncio.timeout(TEST_TIMEOUT):
        options: dict[str, Any] = {"state_dir": tmp_path / "demo-state", "env": ENV}
        log1, log2 = tmp_path / "broker1.log", tmp_path / "broker2.log"
        async with broker_process(redis_url, log_path=log1, **options) as first:
            client = await acp_client(first.url)
            ids = [await client.new(cwd=f"/work/order{i}") for i in range(3)]
            await client.prompt(ids[0], "/notool oldest gets the newest activity")
            # The listing at rest: the prompt's last events indexed (a walk as the turn
            # ends can read the index between two of the projector's batches).
            await _until_indexed(redis_url, ids)
            before = await _walk(client)
            assert [s.session_id for s in before] == [ids[0], ids[2], ids[1]]
            await client.close()
            await _stop(first, stop)

        async with broker_process(redis_url, log_path=log2, **options) as second:
            client = await acp_client(second.url)
            await _until_indexed(redis_url, ids)  # anything the restart logged, indexed
            after = await _walk(client)
            assert [(s.session_id, s.updated_at, s.title) for s in after] == [
                (s.session_id, s.updated_at, s.title) for s in before
            ]
            await client.close()
