"""ACP v1 end to end: the acp package's client drives the broker over WebSocket."""

from __future__ import annotations

import pytest
from acp.exceptions import RequestError

from broker.serve import Broker

from .support.client import acp_client, wait_for


async def test_initialize_advertises_broker_capabilities(url: str) -> None:
    client = await acp_client(url)
    caps = client.init.agent_capabilities
    assert client.init.protocol_version == 1
    assert caps.load_session is True
    session_caps = caps.session_capabilities
    for name in ("list", "resume", "close", "delete", "additional_directories"):
        assert getattr(session_caps, name) is not None, name
    await client.close()


async def test_prompt_streams_chunks_tool_call_permission_and_title(url: str) -> None:
    client = await acp_client(url)
    session_id = await client.new(cwd="/work/project")
    assert session_id.startswith("sess_")
    response = await client.prompt(session_id, "hello broker")
    assert response.stop_reason == "end_turn"
    kinds = client.client.kinds(session_id)
    assert kinds.count("agent_message_chunk") >= 3
    assert "tool_call" in kinds and "tool_call_update" in kinds
    assert kinds[-1] == "session_info_update"
    assert "hello broker" in client.client.texts(session_id)
    assert len(client.client.permission_requests) == 1
    # The agent's own session id never leaks: every update names the broker's id.
    assert {sid for sid, _ in client.client.updates} == {session_id}
    listed = await client.conn.list_sessions()
    [info] = [s for s in listed.sessions if s.session_id == session_id]
    assert info.title == "hello broker" and info.cwd == "/work/project"
    await client.close()


async def test_permission_rejected_fails_the_tool_call(url: str) -> None:
    client = await acp_client(url, permission="reject")
    session_id = await client.new()
    await client.prompt(session_id, "please read")
    [update] = [u for sid, u in client.client.updates if u.session_update == "tool_call_update"]
    assert update.status == "failed"
    await client.close()


async def test_load_replays_the_whole_log_and_resume_replays_nothing(url: str) -> None:
    first = await acp_client(url)
    session_id = await first.new()
    await first.prompt(session_id, "one")
    await first.prompt(session_id, "/notool two")
    seen_live = first.client.kinds(session_id)
    await first.close()

    loader = await acp_client(url)
    await loader.conn.load_session(session_id=session_id, cwd="/tmp/project", mcp_servers=[])
    replayed = loader.client.kinds(session_id)
    # The replay is the live stream plus the user's own messages, in order.
    assert [k for k in replayed if k != "user_message_chunk"] == seen_live
    assert replayed.count("user_message_chunk") == 2
    assert replayed.index("user_message_chunk") < replayed.index("agent_message_chunk")

    resumer = await acp_client(url)
    await resumer.conn.resume_session(session_id=session_id, cwd="/tmp/project")
    assert resumer.client.updates == []
    await resumer.prompt(session_id, "/notool three")
    assert "three" in resumer.client.texts(session_id)
    # The loader is still watching: it sees the resumer's prompt and the reply, live.
    await wait_for(lambda: "three" in loader.client.texts(session_id), what="live update")
    assert "three" in loader.client.texts(session_id, "user_message_chunk")
    for client in (loader, resumer):
        await client.close()


async def test_close_stops_updates_and_delete_hides_from_list(url: str) -> None:
    watcher = await acp_client(url)
    actor = await acp_client(url)
    session_id = await actor.new()
    await watcher.conn.resume_session(session_id=session_id, cwd="/tmp/project")
    await watcher.conn.close_session(session_id=session_id)
    await actor.prompt(session_id, "/notool after close")
    assert watcher.client.updates == []

    await actor.request("session/delete", {"sessionId": session_id})
    listed = await actor.conn.list_sessions()
    assert session_id not in [s.session_id for s in listed.sessions]
    # Idempotent, and silent for ids that never existed.
    assert await actor.request("session/delete", {"sessionId": session_id}) == {}
    assert await actor.request("session/delete", {"sessionId": "sess_" + "0" * 32}) == {}
    with pytest.raises(RequestError) as err:
        await actor.conn.load_session(session_id=session_id, cwd="/tmp/project", mcp_servers=[])
    assert err.value.code == -32002
    for client in (watcher, actor):
        await client.close()


async def test_set_mode_and_config_option_pass_through(url: str) -> None:
    client = await acp_client(url)
    session_id = await client.new()
    await client.conn.set_session_mode(session_id=session_id, mode_id="code")
    await wait_for(lambda: "current_mode_update" in client.client.kinds(session_id))
    reply = await client.conn.set_config_option(
        config_id="style", session_id=session_id, value="shouty"
    )
    assert reply.config_options[0].current_value == "shouty"
    await client.close()


async def test_plain_acp_package_agent_behind_the_broker(url: str) -> None:
    client = await acp_client(url)
    session_id = await client.new("/tmp/p", agent="plain")
    await client.prompt(session_id, "ping")
    assert client.client.texts(session_id) == "plain:ping"
    await client.close()


async def test_unknown_agent_is_invalid_params(url: str) -> None:
    client = await acp_client(url)
    with pytest.raises(RequestError) as err:
        await client.new("/tmp/p", agent="nobody")
    assert err.value.code == -32602
    await client.close()


async def test_health_endpoint(broker: Broker) -> None:
    import asyncio
    import urllib.request

    def get() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.port}/healthz", timeout=5) as resp:
            return int(resp.status)

    assert await asyncio.to_thread(get) == 200
