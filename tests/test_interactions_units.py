"""The pending-interaction record: its compare-and-set transitions and its views."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.protocol.interactions import (
    Interaction,
    InteractionRefused,
    State,
    claim_ttl,
    participant_id,
    response_of,
    summary,
)
from workers.agent_host.interactions import HostInteractions, Pending

from .support.client import wait_for

OPTIONS = [
    {"optionId": "allow_once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
]
PARAMS = {"sessionId": "sess_x", "toolCall": {"toolCallId": "c1"}, "options": OPTIONS}
ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}


def opened() -> Interaction:
    return Interaction.opened("sess_x", "session/request_permission", PARAMS, 60)


def test_a_claim_is_a_compare_and_set_on_the_revision() -> None:
    record = opened()
    assert (record.state, record.view()["revision"]) == (State.OPEN, "1")
    claim = record.claim_for("p1", "a1", "1", 30, now=100.0)
    assert record.view()["state"]["claimId"] == claim.claim_id
    assert record.view()["state"]["fencingToken"] == "1"
    with pytest.raises(InteractionRefused) as stale:
        record.claim_for("p2", "a2", "1", 30, now=101.0)
    assert stale.value.condition == "revision_conflict"
    assert stale.value.current is not None and stale.value.current["revision"] == "2"
    with pytest.raises(InteractionRefused):  # the right revision, but another's claim
        record.claim_for("p2", "a2", "2", 30, now=101.0)


def test_only_the_current_claim_answers_and_an_expired_one_reopens() -> None:
    record = opened()
    claim = record.claim_for("p1", "a1", None, 10, now=100.0)
    with pytest.raises(InteractionRefused):  # another participant holding the claim's id
        record.resolve(ALLOW, "p2", None, 101.0, (claim.claim_id, claim.fencing_token))
    with pytest.raises(InteractionRefused):  # a plain answer while another holds it
        record.resolve(ALLOW, "p2", None, 101.0)
    assert record.expire_claim(now=111.0) and record.state == State.OPEN
    assert record.revision == 3
    with pytest.raises(InteractionRefused):  # the expired claim is no longer good
        record.resolve(ALLOW, "p1", None, 112.0, (claim.claim_id, claim.fencing_token))
    second = record.claim_for("p2", "a2", "3", 10, now=112.0)
    assert second.fencing_token == 2
    with pytest.raises(InteractionRefused):  # the same participant, another attachment
        record.resolve(ALLOW, "p2", "4", 113.0, (second.claim_id, second.fencing_token))
    record.resolve(ALLOW, "p2", "4", 113.0, (second.claim_id, second.fencing_token), "a2")
    state = record.view()["state"]
    assert state["type"] == "resolved" and state["resolvedBy"] == "p2"
    assert state["result"] == ALLOW


def test_terminal_states_refuse_every_change() -> None:
    for end in (State.CANCELLED, State.EXPIRED):
        record = opened()
        assert record.end(end, 5.0) and not record.end(State.CANCELLED, 6.0)
        assert f"{end.value}At" in record.view()["state"]
        with pytest.raises(InteractionRefused):
            record.resolve(ALLOW, "p1", None, 7.0)
        with pytest.raises(InteractionRefused):
            record.claim_for("p1", "a", None, 10, 7.0)


def test_release_returns_the_claim() -> None:
    record = opened()
    claim = record.claim_for("p1", "a1", None, 10, now=100.0)
    with pytest.raises(InteractionRefused):
        record.release("a1", claim.claim_id, 99, None, 101.0)  # a wrong fencing token
    with pytest.raises(InteractionRefused):
        record.release("a2", claim.claim_id, claim.fencing_token, None, 101.0)  # not its own
    record.release("a1", claim.claim_id, claim.fencing_token, "2", 101.0)
    assert (record.state, record.revision) == (State.OPEN, 3)


def test_answers_are_checked_against_the_question() -> None:
    assert response_of("permission", PARAMS, {"optionId": "reject_once"}) == {
        "outcome": {"outcome": "selected", "optionId": "reject_once"}
    }
    assert response_of("permission", PARAMS, ALLOW) == ALLOW
    with pytest.raises(InteractionRefused, match="one of the options"):
        response_of("permission", PARAMS, {"optionId": "always"})
    assert response_of("elicitation", {}, {"action": "accept", "content": {"a": 1}}) == {
        "action": "accept",
        "content": {"a": 1},
    }
    assert response_of("elicitation", {}, {"action": "decline", "content": 3}) == {
        "action": "decline"
    }
    with pytest.raises(InteractionRefused):
        response_of("elicitation", {}, {"action": "maybe"})
    with pytest.raises(InteractionRefused):
        claim_ttl("soon")
    assert claim_ttl(None) == 60 and claim_ttl("1.5") == 1.5


def test_views_carry_the_question_and_no_principal() -> None:
    record = opened()
    view = record.view()
    assert "sessionId" not in view["request"] and view["request"]["options"] == OPTIONS
    listed = summary(view)
    assert (listed["id"], listed["kind"], listed["state"]) == (
        record.interaction_id,
        "permission",
        "open",
    )
    assert listed["options"] == OPTIONS
    one, other = participant_id("s1", "token:abc"), participant_id("s2", "token:abc")
    assert one != other and "abc" not in one


async def test_a_claim_timer_that_runs_early_reopens_the_interaction_when_the_claim_ends() -> None:
    """An event loop's timer may run before the wall-clock expiry of the claim it was set
    for (uvloop's count from its iteration's start, in milliseconds): the interaction is
    reopened when the claim is over, not left claimed for ever."""
    logged: list[dict[str, Any]] = []

    class Recorder:
        async def append_all(self, held: Any, bodies: list[dict[str, Any]], **_: Any) -> None:
            logged.extend(bodies)

    held = SimpleNamespace(session_id="sess_x", interactions={}, prompt_task=None)
    host = HostInteractions(cast(Any, Recorder()), timeout=60)
    record = opened()
    pending = Pending(record, asyncio.get_running_loop().create_future())
    held.interactions[record.interaction_id] = pending
    record.claim_for("p1", "a1", "1", 0.3, now=time.time())
    await host._expire(cast(Any, held), pending)  # ran early: the claim has 0.3 s left
    assert record.state == State.CLAIMED and logged == []
    await wait_for(lambda: record.state == State.OPEN, 10, "the claim's expiry")
    await wait_for(lambda: logged, 10, "the reopening logged")
    assert logged[-1]["interaction"]["state"] == {"type": "open"}
    if pending.expiry is not None:
        pending.expiry.cancel()
