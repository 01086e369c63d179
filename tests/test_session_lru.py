"""No cap an editor hits by working normally: past ``max_sessions_per_connection``, a new
session lets the least recently used idle session of the connection go (told by a notice
where the client takes notices; a later load brings it back); the bound still holds, and
only a connection whose every session is busy (a turn running) is refused (-32005)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.front.acp.session_lru import pick
from broker.protocol.render import LET_GO_META
from broker.serve import Broker

from .conftest import make_settings
from .support.client import RawClient, text

NOTICES: dict[str, Any] = {"session": {"notices": {}}}


@pytest.fixture
async def node(store: Any) -> AsyncIterator[Broker]:
    broker = Broker(make_settings(max_sessions_per_connection=2), redis=store)
    await broker.start()
    yield broker
    await broker.stop()


async def _client(node: Broker, caps: dict[str, Any]) -> RawClient:
    client = await RawClient.connect(f"ws://127.0.0.1:{node.port}/acp")
    await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
    return client


def _let_go(client: RawClient) -> list[str]:
    return [
        m["params"]["sessionId"]
        for m in client.inbox
        if m.get("method") == "session/update"
        and (m["params"]["update"].get("_meta") or {}).get(LET_GO_META)
    ]


async def test_a_new_session_lets_the_least_recently_used_go_and_load_brings_it_back(
    node: Broker,
) -> None:
    client = await _client(node, NOTICES)
    first = await client.new_session("/lru")
    second = await client.new_session("/lru")
    prompt = {"sessionId": first, "prompt": text("/notool still here")}
    assert "result" in await client.call("session/prompt", prompt)  # first: used lately
    third = await client.new_session("/lru")
    await client.read_until(lambda: _let_go(client))
    assert _let_go(client) == [second]
    [notice] = [u for u in client.updates(second) if u["update"]["sessionUpdate"] == "notice"]
    assert notice["update"]["severity"] == "info"
    [conn] = node.connections
    assert set(conn.active) == {first, third}
    # Let go, not gone: not active here, and a load brings it back (letting the next go).
    again = await client.call("session/prompt", {"sessionId": second, "prompt": text("x")})
    assert again["error"]["code"] == -32002
    loaded = await client.call(
        "session/load", {"sessionId": second, "cwd": "/lru", "mcpServers": []}
    )
    assert "result" in loaded
    assert set(conn.active) == {first, second} or set(conn.active) == {second, third}
    await client.close()


async def test_a_client_without_notices_is_not_sent_one(node: Broker) -> None:
    client = await _client(node, {})
    for _ in range(3):
        await client.new_session("/quiet")
    assert not [m for m in client.inbox if "notice" in str(m)]
    await client.close()


async def test_sessions_with_a_turn_running_are_kept_and_all_busy_is_refused(
    node: Broker,
) -> None:
    client = await _client(node, NOTICES)
    busy = [await client.new_session("/busy") for _ in range(2)]
    for index, session_id in enumerate(busy):
        await client.send_prompt(f"p{index}", session_id, "/slow 100")
    await client.read_until(lambda: all(client.chunks(s) for s in busy))
    refused = await client.call("session/new", {"cwd": "/busy", "mcpServers": []})
    assert refused["error"]["code"] == -32005
    for session_id in busy:
        cancel = {"sessionId": session_id}
        await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": cancel})
    await client.read_until(lambda: len(_replies(client)) == 2)
    assert [r["result"]["stopReason"] for r in _replies(client)] == ["cancelled"] * 2
    assert "result" in await client.call("session/new", {"cwd": "/busy", "mcpServers": []})
    await client.close()


def _replies(client: RawClient) -> list[dict[str, Any]]:
    return [m for m in client.inbox if m.get("id") in ("p0", "p1") and "method" not in m]


def test_pick_takes_the_least_recently_used_idle_ones() -> None:
    used = {"a": 3, "b": 1, "c": 2, "d": 4}
    assert pick(used, busy=[], room=2) == ["b", "c"]
    assert pick(used, busy=["b"], room=2) == ["c", "a"]
    assert pick(used, busy=["a", "b", "c", "d"], room=1) == []
    assert pick(used, busy=[], room=0) == []
