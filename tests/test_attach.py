"""``session/attach``, ``session/ready`` and ``session/detach`` (the ACP Remote draft's
attachments), over WebSocket: draft clients on one front, a plain window driving the
session on another, both nodes on one real redis-server with the demo agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.serve import Broker
from broker.store.client import connect

from .conftest import make_settings
from .support.client import RawClient, wait_for

BARRIER_TIMEOUT = 3.0
"""The fronts' ``attach_barrier_timeout``: short, so that a test sees an attachment expire;
long enough that a loaded machine's ``session/ready`` right after its attach is in time."""


@pytest.fixture
async def fronts(redis_url: str) -> AsyncIterator[list[Broker]]:
    """Two broker nodes (front and agent host each) on one real Redis."""
    nodes = []
    for _ in range(2):
        node = Broker(
            make_settings(attach_barrier_timeout=BARRIER_TIMEOUT), redis=connect(redis_url)
        )
        await node.start()
        nodes.append(node)
    yield nodes
    for node in nodes:
        await node.stop()
        await node.redis.aclose()


def ws_url(node: Broker) -> str:
    return f"ws://127.0.0.1:{node.port}/acp"


async def draft_client(node: Broker, version: int = 2, **meta: Any) -> RawClient:
    """A client that negotiated the draft's ``capabilities.remote``."""
    client = await RawClient.connect(ws_url(node))
    caps: dict[str, Any] = {"remote": {"core": {}, "sharedSessions": {}}}
    field = "clientCapabilities" if version == 1 else "capabilities"
    params: dict[str, Any] = {"protocolVersion": version, field: caps}
    if meta:
        params["_meta"] = meta
    reply = await client.call("initialize", params)
    assert "result" in reply, reply
    return client


async def driven_session(node: Broker) -> tuple[RawClient, str]:
    """A plain v1 window with a session that ran one turn (``/chunks N``: the demo agent's
    turn of N chunks that asks nothing)."""
    window = await RawClient.initialized(ws_url(node))
    session_id = await window.new_session("/srv/a")
    await prompt(window, session_id, "/chunks 1")
    return window, session_id


async def prompt(window: RawClient, session_id: str, words: str) -> None:
    window.next_id += 1
    await window.send_prompt(window.next_id, session_id, words)
    reply = await window.reply_to(window.next_id)
    assert reply["result"]["stopReason"] == "end_turn", reply


def attach_params(session_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "operationId": "op-attach-1",
        "attachmentCapabilities": {},
        "subscriptions": ["events"],
        **extra,
    }


def ready_params(session_id: str, attached: dict[str, Any]) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "attachmentId": attached["attachmentId"],
        "deliveryBarrierId": attached["deliveryBarrierId"],
        "operationId": "op-ready-1",
    }


async def log_seq(node: Broker, session_id: str) -> int:
    return (await node.log.snapshot(node.settings.tenant, session_id)).seq


def held_on(node: Broker, session_id: str) -> int:
    """Events a front holds behind an attachment's barrier (the most any connection does)."""
    return max(
        (
            len(c.active[session_id].held or [])
            for c in node.front.connections
            if session_id in c.active
        ),
        default=0,
    )


def delivered_seqs(client: RawClient, session_id: str) -> list[str]:
    """The ids of the agent's message chunks the client was sent (v2), in order."""
    return [
        u["update"]["messageId"]
        for u in client.updates(session_id)
        if u["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


async def test_attach_buffers_until_ready_then_replays_and_tails_in_order(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    window, session_id = await driven_session(a)
    viewer = await draft_client(b)
    reply = await viewer.call(
        "session/attach", attach_params(session_id, replayFrom={"type": "start"})
    )
    attached = reply["result"]
    snapshot = await a.log.snapshot(a.settings.tenant, session_id)
    assert attached["attachmentId"].startswith("attachment_")
    assert attached["participantId"].startswith("participant_")
    assert attached["attachmentRevision"] == "1"
    assert attached["controlPolicy"] == "ordered_multi_writer"
    assert attached["sessionEpoch"] == snapshot.epoch
    assert int(attached["sessionVersion"]) >= 1
    assert attached["recovery"] == {
        "type": "event_replay",
        "latestSourceEventId": f"event_{snapshot.epoch}_{attached['sessionVersion']}",
    }
    assert attached["effectiveSubscriptions"] == ["events"]
    # Authentication off: the caller holds every scope, so every role (default_roles).
    assert attached["roles"] == ["approver", "controller", "observer", "owner"]
    assert "session.write" in attached["effectivePermissions"]
    # A turn runs while the barrier stands: its events wait at the front, none is sent.
    await prompt(window, session_id, "/chunks 2")
    head = await log_seq(a, session_id)
    await wait_for(lambda: held_on(b, session_id) >= head, what="the turn held at front b")
    listed = await viewer.call("session/list", {})
    assert "result" in listed
    assert viewer.updates(session_id) == []
    # Ready: the history (both turns), in order, once; then live.
    done = await viewer.call("session/ready", ready_params(session_id, attached))
    assert done == {"jsonrpc": "2.0", "id": done["id"], "result": {}}
    await viewer.read_until(lambda: len(window_texts(viewer, session_id)) >= 2, 30)
    await prompt(window, session_id, "/chunks 3")
    await viewer.read_until(lambda: len(window_texts(viewer, session_id)) >= 3, 30)
    texts = window_texts(viewer, session_id)
    assert texts == ["/chunks 1", "/chunks 2", "/chunks 3"], texts
    await window.close()
    await viewer.close()


def window_texts(client: RawClient, session_id: str) -> list[str]:
    """The user prompts a v2 viewer was sent, in order (one per turn)."""
    return [
        block["text"]
        for u in client.updates(session_id)
        if u["update"].get("sessionUpdate") == "user_message"
        for block in u["update"].get("content", [])
        if isinstance(block, dict) and block.get("type") == "text"
    ]
