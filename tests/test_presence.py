"""Presence over WebSocket, REST and MCP, on two front nodes of one real redis-server: who
is attached to a session (snapshot and deltas), idle windows going ``away``, the privacy
filter, and a front killed -9 whose windows leave within the stated bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from mcp import Client

from broker.protocol.presence import ENTRY_FIELDS, display_name
from broker.serve import Broker

from .support.broker_process import broker_process
from .support.client import RawClient, tool_result_text, wait_for
from .support.nodes import broker_pair
from .test_attach import attach_params, draft_client, ready_params, ws_url
from .test_scale_out import FRONT_ONLY

IDLE_AFTER = 2.0
"""Seconds without a request before a window shows ``away``: short, for the idle test."""
TTL = 3.0
"""The fronts' ``presence_ttl``: their sweeps run every second."""
PRESENCE = "acpBroker/presence"


@pytest.fixture
async def fronts(redis_url: str) -> AsyncIterator[list[Broker]]:
    """Two broker nodes (front and agent host each) on one real Redis."""
    async with broker_pair(redis_url, presence_idle_after=IDLE_AFTER, presence_ttl=TTL) as nodes:
        yield nodes


async def window(node: Broker, name: str | None, *, follows: bool = True) -> RawClient:
    """A plain v1 window; ``name``: its ``clientInfo`` name; ``follows``: asks for presence."""
    client = await RawClient.connect(ws_url(node))
    caps: dict[str, Any] = {"_meta": {PRESENCE: True}} if follows else {}
    params: dict[str, Any] = {"protocolVersion": 1, "clientCapabilities": caps}
    if name is not None:
        params["clientInfo"] = {"name": name, "version": "1"}
    assert "result" in await client.call("initialize", params)
    return client


async def load(client: RawClient, session_id: str) -> None:
    params = {"sessionId": session_id, "cwd": "/srv/p", "mcpServers": []}
    assert "result" in await client.call("session/load", params)


def deltas(client: RawClient, session_id: str) -> list[dict[str, Any]]:
    """The presence changes the client was sent for the session, in order."""
    return [
        u["update"]["_meta"][PRESENCE]
        for u in client.updates(session_id)
        if PRESENCE in (u["update"].get("_meta") or {})
    ]


def changed(client: RawClient, session_id: str, change: str, name: str) -> bool:
    return any(
        d["change"] == change and d.get("participant", {}).get("displayName") == name
        for d in deltas(client, session_id)
    )


async def present(node: Broker, session_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}") as http:
        answer = await http.get(f"/v1/sessions/{session_id}/presence")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def names(document: dict[str, Any]) -> list[str]:
    return sorted(p.get("displayName", "") for p in document["participants"])


async def test_snapshot_and_deltas_across_two_fronts(fronts: list[Broker]) -> None:
    a, b = fronts
    alice = await window(a, "Alice")
    session_id = await alice.new_session("/srv/p")
    viewer = await draft_client(b, displayName="Viewer")
    params = attach_params(session_id, subscriptions=["events", "presence"])
    attached = (await viewer.call("session/attach", params))["result"]
    assert attached["effectiveSubscriptions"] == ["events", "presence"]
    await wait_for(lambda: _has(present(a, session_id), "Viewer"), what="the viewer present")
    assert "result" in await viewer.call("session/ready", ready_params(session_id, attached))
    # First a snapshot: Alice (front a) and the viewer itself (front b).
    await viewer.read_until(lambda: _snapshot(viewer, session_id), 30)
    snapshot = _snapshot(viewer, session_id)
    assert snapshot is not None
    assert sorted(p.get("displayName") for p in snapshot["participants"]) == ["Alice", "Viewer"]
    # Then deltas, from the other front too: Bob opens the session on b, then leaves.
    bob = await window(b, "Bob", follows=False)
    await load(bob, session_id)
    await alice.read_until(lambda: changed(alice, session_id, "joined", "Bob"), 30)
    await viewer.read_until(lambda: changed(viewer, session_id, "joined", "Bob"), 30)
    await bob.close()
    await alice.read_until(lambda: changed(alice, session_id, "left", "Bob"), 30)
    await viewer.read_until(lambda: changed(viewer, session_id, "left", "Bob"), 30)
    # Deltas after the snapshot are newer than it (one before it, its own joining, was
    # held behind the barrier: a client drops what its snapshot's revision covers).
    seen = deltas(viewer, session_id)
    after = seen[seen.index(snapshot) + 1 :]
    revisions = [int(d["presenceRevision"]) for d in after]
    assert revisions == sorted(revisions) and revisions[0] > int(snapshot["presenceRevision"])
    assert names(await present(b, session_id)) == ["Alice", "Viewer"]
    # The viewer detaches: it leaves presence; the session is untouched.
    detach = {**attach_params(session_id), "attachmentId": attached["attachmentId"]}
    assert "result" in await viewer.call("session/detach", detach)
    await alice.read_until(lambda: changed(alice, session_id, "left", "Viewer"), 30)
    assert names(await present(a, session_id)) == ["Alice"]
    await alice.close()
    await viewer.close()


async def test_a_burst_of_windows_is_each_a_change_with_its_own_revision(
    fronts: list[Broker],
) -> None:
    """Twenty windows open one session at once (the board writes them in a few batches):
    a follower hears each join once, in order, every one with a revision of its own."""
    a, b = fronts
    alice = await window(a, "Alice")
    session_id = await alice.new_session("/srv/p")
    burst = [await window(b, f"w{i}", follows=False) for i in range(20)]
    await asyncio.gather(*(load(w, session_id) for w in burst))

    def joined() -> list[dict[str, Any]]:
        return [
            d
            for d in deltas(alice, session_id)
            if d["change"] == "joined" and d["participant"].get("displayName") != "Alice"
        ]

    await alice.read_until(lambda: len(joined()) >= 20, 30)
    names_seen = [d["participant"].get("displayName") for d in joined()]
    assert sorted(names_seen) == sorted(f"w{i}" for i in range(20))
    revisions = [int(d["presenceRevision"]) for d in joined()]
    assert revisions == sorted(set(revisions)), revisions  # distinct, rising
    assert len(names(await present(a, session_id))) == 21
    for w in [*burst, alice]:
        await w.close()


def _snapshot(client: RawClient, session_id: str) -> dict[str, Any] | None:
    found = [d for d in deltas(client, session_id) if d["change"] == "snapshot"]
    return found[0] if found else None


async def _has(document: Any, name: str) -> bool:
    return name in names(await document)


async def test_windows_that_do_not_ask_are_spared_and_nothing_private_shows(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    alice = await window(a, "Alice")
    session_id = await alice.new_session("/srv/p")
    quiet = await window(b, "Quiet", follows=False)
    await load(quiet, session_id)
    await alice.read_until(lambda: changed(alice, session_id, "joined", "Quiet"), 30)
    # The quiet window is sent no presence (a request's answer orders what came before it).
    assert "result" in await quiet.call("session/list", {})
    assert deltas(quiet, session_id) == []
    document = await present(b, session_id)
    assert names(document) == ["Alice", "Quiet"]
    for participant in document["participants"]:
        assert set(participant) <= set(ENTRY_FIELDS)
        assert participant["state"] == "online" and participant["roles"]
    text = json.dumps([document, deltas(alice, session_id)])
    connections = [c.id for node in fronts for c in node.front.connections]
    for private in ["anonymous", "127.0.0.1", *connections]:
        assert private not in text, private
    # The same, as the MCP tool reads it.
    async with Client(f"http://127.0.0.1:{a.http_port}/mcp") as mcp:
        result = await mcp.call_tool("session_presence", {"id": session_id})
        lines = tool_result_text(result).splitlines()
    assert lines[0] == f"presence revision {document['presenceRevision']}"
    assert sorted(line.split("  ")[1] for line in lines[1:]) == ["Alice", "Quiet"]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.http_port}") as http:
        missing = await http.get("/v1/sessions/sess_" + "0" * 32 + "/presence")
    assert missing.status_code == 404 and missing.json()["code"] == "session_not_found"
    await alice.close()
    await quiet.close()


async def test_an_idle_window_goes_away_and_comes_back(fronts: list[Broker]) -> None:
    a, b = fronts
    alice = await window(a, "Alice")
    session_id = await alice.new_session("/srv/p")
    watcher = await window(b, "Watcher")
    await load(watcher, session_id)

    def state_of(name: str) -> str | None:
        found = [
            d["participant"]["state"]
            for d in deltas(watcher, session_id)
            if d["change"] in ("joined", "state") and d["participant"].get("displayName") == name
        ]
        return found[-1] if found else None

    # No request on the session for IDLE_AFTER seconds: away (within a sweep period more).
    await watcher.read_until(lambda: state_of("Alice") == "away", IDLE_AFTER + 30)
    # A request on the session: online again.
    params = {"sessionId": session_id, "configId": "nothing", "value": "x"}
    await alice.call("session/set_config_option", params)
    await watcher.read_until(lambda: state_of("Alice") == "online", 30)
    await alice.close()
    await watcher.close()


@pytest.mark.slow
async def test_a_killed_front_leaves_presence_within_its_ttl(
    redis_url: str, tmp_path: Path, fronts: list[Broker]
) -> None:
    """A front process killed -9 refreshes nothing more: its windows' entries lapse after
    its ``presence_ttl`` and the surviving front's sweep logs their leaving."""
    a, _ = fronts
    alice = await window(a, "Alice")
    session_id = await alice.new_session("/srv/p")
    env = {"ACP_BROKER_PRESENCE_TTL": "2"}
    async with broker_process(
        redis_url, log_path=tmp_path / "front.log", extra_args=FRONT_ONLY, env=env
    ) as doomed:
        ghost = await RawClient.connect(doomed.url)
        info = {"name": "Ghost", "version": "1"}
        params = {"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": info}
        assert "result" in await ghost.call("initialize", params)
        await load(ghost, session_id)
        await alice.read_until(lambda: changed(alice, session_id, "joined", "Ghost"), 30)
        await doomed.kill()
        # Gone from the snapshot once its TTL (2 s) is past; its leaving logged by a's sweep.
        await alice.read_until(lambda: changed(alice, session_id, "left", "Ghost"), 2 + TTL + 30)
        assert names(await present(a, session_id)) == ["Alice"]
    await alice.close()


def test_a_shared_name_is_printable_short_and_only_what_the_client_gave() -> None:
    assert display_name(
        {"_meta": {"displayName": " Ann\x1b[31m "}, "clientInfo": {"name": "x"}}
    ) == ("Ann[31m")
    assert display_name({"clientInfo": {"name": "zed", "title": "Zed"}}) == "Zed"
    assert display_name({"info": {"name": "console"}}) == "console"  # ACP v2's field
    assert display_name({"clientInfo": {"name": "é" * 100}}) == "é" * 64
    assert display_name({"clientInfo": {"name": "\n\t"}}) is None
    assert display_name({}) is None
