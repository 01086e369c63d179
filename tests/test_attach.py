"""``session/attach``, ``session/ready`` and ``session/detach`` (the ACP Remote draft's
attachments), over WebSocket: draft clients on one front, a plain window driving the
session on another, both nodes on one real redis-server with the demo agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.front.acp.active import ATTACHMENT_EXPIRED
from broker.serve import Broker
from broker.store.events import EventType, events_of

from .support.client import RawClient, wait_for
from .support.nodes import broker_pair

BARRIER_TIMEOUT = 3.0
"""The fronts' ``attach_barrier_timeout``: short, so that a test sees an attachment expire;
long enough that a loaded machine's ``session/ready`` right after its attach is in time."""


@pytest.fixture
async def fronts(redis_url: str) -> AsyncIterator[list[Broker]]:
    """Two broker nodes (front and agent host each) on one real Redis."""
    async with broker_pair(redis_url, attach_barrier_timeout=BARRIER_TIMEOUT) as nodes:
        yield nodes


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
    # A draft client is told of its attachment's expiry unasked (the draft's mandatory
    # control message), as an extension notification.
    assert client.checker is not None
    client.checker.extensions = client.checker.extensions | {ATTACHMENT_EXPIRED}
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
    """The last seq a front holds behind an attachment's barrier (the furthest any
    connection does; 0: none)."""
    return max(
        (
            held[-1].seq
            for c in node.front.connections
            if session_id in c.active and (held := c.active[session_id].held)
        ),
        default=0,
    )


async def last_event_seq(node: Broker, session_id: str) -> int:
    """The seq of the log's last event that is not a presence change (which an attachment
    that did not subscribe to presence is not handed, held or not)."""
    epoch, rows = await node.log.read_rows(node.settings.tenant, session_id)
    events = [e for e in events_of(rows, epoch) if e.type != EventType.PRESENCE]
    return events[-1].seq


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
    head = await last_event_seq(a, session_id)
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


async def test_a_wrong_barrier_is_a_revision_conflict_and_activates_nothing(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    window, session_id = await driven_session(a)
    viewer = await draft_client(b, version=1)
    attached = (await viewer.call("session/attach", attach_params(session_id)))["result"]
    wrong = {**ready_params(session_id, attached), "deliveryBarrierId": "barrier_nope"}
    refused = await viewer.call("session/ready", wrong)
    assert refused["error"]["code"] == -32600
    assert refused["error"]["data"] == {
        "condition": "revision_conflict",
        "retryable": False,
        "conflictDomain": "attachment_barrier",
    }
    # Still behind its barrier: a turn's events are held, not sent.
    await prompt(window, session_id, "/chunks 1")
    head = await log_seq(a, session_id)
    await wait_for(lambda: held_on(b, session_id) >= 1, what="the turn held at front b")
    assert (await viewer.call("session/list", {}))["result"] is not None
    assert viewer.updates(session_id) == []
    # The right barrier: the held turn (no replay was asked: only what followed the attach).
    assert "result" in await viewer.call("session/ready", ready_params(session_id, attached))
    await viewer.read_until(lambda: chunk_count(viewer, session_id) >= 1, 30)
    positions = [u["_meta"]["acpBroker/position"]["seq"] for u in viewer.updates(session_id)]
    assert positions == sorted(set(positions)) and positions[-1] <= head
    assert positions[0] > int(attached["sessionVersion"])  # nothing from before the boundary
    again = await viewer.call("session/ready", ready_params(session_id, attached))
    assert again["error"]["data"]["condition"] == "revision_conflict"  # crossed already
    await window.close()
    await viewer.close()


def chunk_count(client: RawClient, session_id: str) -> int:
    return sum(
        1
        for u in client.updates(session_id)
        if u["update"].get("sessionUpdate") == "agent_message_chunk"
    )


async def test_replay_after_an_event_starts_strictly_after_it(fronts: list[Broker]) -> None:
    a, b = fronts
    window, session_id = await driven_session(a)
    boundary = await log_seq(a, session_id)
    epoch = (await a.log.snapshot(a.settings.tenant, session_id)).epoch
    await prompt(window, session_id, "/chunks 2")
    viewer = await draft_client(b, version=1)
    after = {"type": "after_event", "sourceEventId": f"event_{epoch}_{boundary}"}
    attached = (await viewer.call("session/attach", attach_params(session_id, replayFrom=after)))[
        "result"
    ]
    assert attached["recovery"]["type"] == "event_replay"
    assert "result" in await viewer.call("session/ready", ready_params(session_id, attached))
    await viewer.read_until(lambda: chunk_count(viewer, session_id) >= 2, 30)
    positions = [u["_meta"]["acpBroker/position"]["seq"] for u in viewer.updates(session_id)]
    assert positions[0] == boundary + 1 and positions == sorted(set(positions))
    # A cursor this log never gave out: a snapshot is required (nothing said of it).
    stranger = await draft_client(b, version=1)
    unknown = {"type": "after_event", "sourceEventId": "event_0000_3"}
    other = (await stranger.call("session/attach", attach_params(session_id, replayFrom=unknown)))[
        "result"
    ]
    assert other["recovery"] == {"type": "snapshot_required", "condition": "cursor_gap"}
    await window.close()
    await viewer.close()
    await stranger.close()


async def test_detach_is_idempotent_and_the_session_runs_on(fronts: list[Broker]) -> None:
    a, b = fronts
    window, session_id = await driven_session(a)
    viewer = await draft_client(b)
    attached = (await viewer.call("session/attach", attach_params(session_id)))["result"]
    assert "result" in await viewer.call("session/ready", ready_params(session_id, attached))
    detach = {
        "sessionId": session_id,
        "attachmentId": attached["attachmentId"],
        "operationId": "op-detach-1",
    }
    assert (await viewer.call("session/detach", detach))["result"] == {}
    assert (await viewer.call("session/detach", detach))["result"] == {}  # again: a no-op
    # The session was neither closed nor cancelled: its window prompts on.
    await prompt(window, session_id, "/chunks 2")
    snapshot = await a.log.snapshot(a.settings.tenant, session_id)
    assert snapshot.status == "RUNNING"
    assert (await viewer.call("session/list", {}))["result"] is not None
    assert chunk_count(viewer, session_id) == 0  # delivery stopped at the detach
    # Another connection cannot detach this one's attachment (nor learn whether it exists).
    other = await draft_client(a)
    foreign = await other.call("session/detach", detach)
    assert foreign["error"]["data"]["condition"] == "forbidden"
    await window.close()
    await viewer.close()
    await other.close()


async def test_an_unacknowledged_barrier_expires_the_attachment(fronts: list[Broker]) -> None:
    a, b = fronts
    window, session_id = await driven_session(a)
    viewer = await draft_client(b)
    attached = (await viewer.call("session/attach", attach_params(session_id)))["result"]
    assert attached["_meta"]["acpBroker/barrierTimeoutSeconds"] == BARRIER_TIMEOUT

    def expired() -> list[dict[str, Any]]:
        return [m for m in viewer.inbox if m.get("method") == ATTACHMENT_EXPIRED]

    await viewer.read_until(expired, BARRIER_TIMEOUT + 30)
    assert expired()[0]["params"]["attachmentId"] == attached["attachmentId"]
    late = await viewer.call("session/ready", ready_params(session_id, attached))
    assert late["error"]["data"]["condition"] == "revision_conflict"
    assert not any(session_id in c.active for c in b.front.connections)
    await window.close()
    await viewer.close()


BAD_ATTACHES: list[tuple[dict[str, Any], str]] = [
    ({"subscriptions": None}, "subscriptions must be a list"),
    ({"subscriptions": ["events", "events"]}, "must not repeat"),
    ({"subscriptions": ["gossip"]}, "unknown subscription 'gossip'"),
    ({"attachmentCapabilities": None}, "attachmentCapabilities must be an object"),
    ({"operationId": ""}, "operationId must be a string"),
    ({"replayFrom": None}, "replayFrom must be an object"),
    ({"replayFrom": {"type": "after_event"}}, "replayFrom.sourceEventId"),
    ({"sessionId": 7}, "sessionId must be a non-empty string"),
]


async def test_bad_params_are_invalid_params_and_plain_clients_have_no_attach(
    fronts: list[Broker],
) -> None:
    a, _ = fronts
    window = await RawClient.initialized(ws_url(a))
    session_id = await window.new_session("/srv/a")
    viewer = await draft_client(a)
    for change, says in BAD_ATTACHES:
        refused = await viewer.call("session/attach", {**attach_params(session_id), **change})
        assert refused["error"]["code"] == -32602 and says in refused["error"]["message"], refused
    no_barrier = {"sessionId": session_id, "attachmentId": "attachment_0", "operationId": "o"}
    refused = await viewer.call("session/ready", no_barrier)
    assert refused["error"]["code"] in (-32602, -32600), refused
    for method in ("session/attach", "session/ready", "session/detach"):
        refused = await window.call(method, attach_params(session_id))
        assert refused["error"]["code"] == -32601, refused
    await window.close()
    await viewer.close()
