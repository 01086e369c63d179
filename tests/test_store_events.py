"""broker.store.events: events and the fold of a log into a snapshot."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol.interactions import Interaction, State, cancelled_for_host_loss
from broker.store.client import connect
from broker.store.events import (
    EventType,
    LogEvent,
    SessionSnapshot,
    Status,
    fold,
    is_index_neutral,
)
from broker.store.log import SessionLog

from .support.strategies import json_values

# -- events and fold --------------------------------------------------------------------------

EPOCH = "e0"


def ev(seq: int, body: dict[str, Any], ts: int | None = None) -> LogEvent:
    return LogEvent(seq=seq, epoch=EPOCH, ts=1000 + seq if ts is None else ts, body=body)


def info(**fields: Any) -> dict[str, Any]:
    update = {"sessionUpdate": "session_info_update"}
    update.update({("_meta" if k == "meta" else k): v for k, v in fields.items()})
    return {"type": EventType.UPDATE, "update": update}


CREATED = {
    "type": EventType.CREATED,
    "cwd": "/w/p",
    "additionalDirectories": ["/w/lib"],
    "agent": "demo",
    "kind": "shell",
    "meta": {"a": 1, "b": {"x": [1, 2]}},
}


def test_fold_of_nothing_is_none() -> None:
    assert fold("t", "s", []) is None


def test_fold_of_a_hand_made_log() -> None:
    bodies: list[dict[str, Any]] = [
        CREATED,
        info(title="First"),
        info(meta={"a": None, "c": "new"}),
        info(updatedAt="2024-05-01T00:00:00Z"),
        {"type": EventType.UPDATE, "update": {"sessionUpdate": "agent_message_chunk"}},
        {"type": EventType.PROMPT, "promptId": "p1"},
        {"type": EventType.BOUND, "agentSessionId": "agent-1"},
        info(title=None, meta={"b": None}),
        {"type": EventType.PROMPT_END, "stopReason": "end_turn"},
        {"type": EventType.STATUS, "status": Status.STOPPED},
        info(updatedAt=None, title="Second"),
        info(meta=None),
    ]
    events = [ev(n + 1, body) for n, body in enumerate(bodies)]

    def at(n: int) -> SessionSnapshot:
        snap = fold("t", "s", events[:n])
        assert snap is not None
        return snap

    first = at(1)
    assert (first.tenant, first.session_id, first.epoch, first.seq) == ("t", "s", EPOCH, 1)
    assert (first.created_ms, first.updated_ms) == (1001, 1001)
    assert first.cwd == "/w/p" and first.additional_directories == ["/w/lib"]
    assert (first.agent, first.kind, first.status) == ("demo", "shell", Status.RUNNING)
    assert first.title is None and first.updated_at is None and first.prompt_id is None
    assert first.meta == {"a": 1, "b": {"x": [1, 2]}}

    assert at(2).title == "First"
    assert at(3).meta == {"b": {"x": [1, 2]}, "c": "new"}
    assert at(4).updated_at == "2024-05-01T00:00:00Z"
    assert at(5).seq == 5 and at(5).updated_ms == 1005
    assert at(6).prompt_id == "p1"
    assert at(7).agent_session_id == "agent-1"
    eighth = at(8)
    assert eighth.title is None and eighth.meta == {"c": "new"}
    assert eighth.updated_at == "2024-05-01T00:00:00Z"  # omitted = unchanged
    assert at(9).prompt_id is None
    assert at(10).status == Status.STOPPED and not at(10).deleted
    eleventh = at(11)
    assert eleventh.updated_at is None and eleventh.title == "Second"
    last = at(12)
    assert last.meta == {} and last.title == "Second" and last.created_ms == 1001
    assert last.agent_session_id == "agent-1" and last.cwd == "/w/p"

    deleted = fold("t", "s", [*events, ev(13, {"type": EventType.DELETED})])
    assert deleted is not None and deleted.deleted and deleted.status == Status.DELETED
    assert deleted.seq == 13


def test_fold_deleted_clears_a_running_prompt() -> None:
    events = [
        ev(1, CREATED),
        ev(2, {"type": EventType.PROMPT, "promptId": "p9"}),
        ev(3, {"type": EventType.DELETED}),
    ]
    snap = fold("t", "s", events)
    assert snap is not None and snap.prompt_id is None and snap.deleted


def test_fold_ignores_unknown_event_types_and_other_updates() -> None:
    events = [
        ev(1, CREATED),
        ev(2, {"type": "something-new", "title": "x"}),
        ev(3, {"type": EventType.NOTICE, "text": "hi"}),
        ev(4, {"type": EventType.UPDATE, "update": {"sessionUpdate": "plan", "title": "no"}}),
    ]
    snap = fold("t", "s", events)
    assert snap is not None and snap.title is None and snap.seq == 4


def _interaction_events() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two questions' records as the host logs them: one answered, one left claimed."""
    params = {"sessionId": "s", "toolCall": {"toolCallId": "c"}, "options": []}
    first = Interaction.opened("s", "session/request_permission", params)
    second = Interaction.opened("s", "elicitation/create", {"message": "name?"})
    views = [first.view(), second.view()]
    first.end(State.CANCELLED, 2.0)
    second.claim_for("p", "a", "1", 30, now=1.0)
    views += [first.view(), second.view()]
    bodies = [{"type": EventType.INTERACTION, "interaction": v} for v in views]
    return bodies, views


def test_the_snapshot_keeps_the_pending_interactions_until_they_end() -> None:
    """What a host taking the session over cancels: the last record of each interaction
    left open or claimed; the events leave the session's listing alone."""
    bodies, views = _interaction_events()
    events = [ev(1, CREATED), *(ev(n + 2, body) for n, body in enumerate(bodies))]
    both = fold("t", "s", events[:3])
    assert both is not None and both.interactions == views[:2]
    left = fold("t", "s", events)
    assert left is not None and left.interactions == [views[3]]
    assert all(is_index_neutral(body) for body in bodies)
    ended = cancelled_for_host_loss(views[3], 5.0)
    assert (ended["revision"], ended["state"]["type"]) == ("3", "cancelled")
    assert ended["state"]["_meta"] == {"acpBroker/reason": "host_lost"}
    gone = fold("t", "s", [*events, ev(6, {"type": EventType.INTERACTION, "interaction": ended})])
    assert gone is not None and gone.interactions == []


async def test_the_store_keeps_the_pending_interactions_as_the_fold_does() -> None:
    bodies, _ = _interaction_events()
    store = connect(None)
    try:
        log = SessionLog(store)
        await log.create("tenant", "sess_i", CREATED)
        for body in bodies:
            await log.append("tenant", "sess_i", body)
        events = await log.read("tenant", "sess_i")
        assert fold("tenant", "sess_i", events) == await log.snapshot("tenant", "sess_i")
    finally:
        await store.aclose()


meta_values = st.none() | json_values
meta_patch = st.none() | st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "acpBroker/x", "ünï"]), meta_values, max_size=4
)
info_patch = st.fixed_dictionaries(
    {},
    optional={
        "title": st.none() | st.text(max_size=12),
        "updatedAt": st.none() | st.sampled_from(["2024-01-01T00:00:00Z", "2030-12-31T23:59:59Z"]),
        "_meta": meta_patch,
    },
)


async def _fold_against_store(patches: list[dict[str, Any]]) -> None:
    store = connect(None)
    try:
        log = SessionLog(store)
        await log.create("tenant", "sess_p", {**CREATED, "meta": {"a": 0, "b": "keep"}})
        for patch in patches:
            body = {
                "type": EventType.UPDATE,
                "update": {"sessionUpdate": "session_info_update", **patch},
            }
            await log.append("tenant", "sess_p", body)
        events = await log.read("tenant", "sess_p")
        assert [e.seq for e in events] == list(range(1, len(patches) + 2))
        assert fold("tenant", "sess_p", events) == await log.snapshot("tenant", "sess_p")
    finally:
        await store.aclose()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(info_patch, max_size=8))
def test_fold_equals_the_snapshot_the_store_keeps(patches: list[dict[str, Any]]) -> None:
    asyncio.run(_fold_against_store(patches))
