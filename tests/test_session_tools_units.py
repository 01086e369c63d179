"""Pure parts of the session tools: turn reports, SSE frames and positions, idempotency keys,
inputs; and operation claims (how every front holds an idempotency key) against a real
redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.errors import ApiError
from broker.front.http.event_stream import frame, resume_after
from broker.front.http.keyed import checked_key
from broker.front.http.session_tools import live_view_url
from broker.front.http.tool_models import session_id_of, wait_of
from broker.front.http.turns import turn_report
from broker.front.operation_claims import OperationClaim
from broker.protocol.operations import digest
from broker.store.client import connect
from broker.store.events import LogEvent
from broker.store.operations import RETENTION_SECONDS, Claim, OperationKey, OperationLedger


def event(seq: int, body: dict[str, Any]) -> LogEvent:
    return LogEvent(seq, "e", 0, body)


def chunk(seq: int, text: str) -> LogEvent:
    content = {"type": "text", "text": text}
    return event(
        seq,
        {"type": "update", "update": {"sessionUpdate": "agent_message_chunk", "content": content}},
    )


TURN = [
    chunk(1, "before the turn"),
    event(2, {"type": "prompt", "promptId": "p1", "prompt": []}),
    chunk(3, "Hello, "),
    event(
        4,
        {
            "type": "update",
            "update": {
                "sessionUpdate": "tool_call",
                "toolCallId": "c1",
                "title": "Read README.md",
                "kind": "read",
                "status": "pending",
            },
        },
    ),
    event(5, {"type": "state", "state": "requires_action"}),
]


def test_a_turn_that_waits_for_a_person_says_so_with_the_live_view() -> None:
    report = turn_report("p1", TURN)
    assert (report.started, report.ended, report.waiting, report.state) == (
        True,
        False,
        True,
        "waiting",
    )
    lines = report.text_lines("http://b/sessions/s")
    assert lines[0] == "Hello, " and lines[1] == "tool call: Read README.md (read, pending)"
    assert "http://b/sessions/s" in lines[2] and lines[-1] == "still running"


def test_an_ended_turn_ends_with_its_stop_reason() -> None:
    updated = {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed"}
    events = [
        *TURN,
        event(6, {"type": "state", "state": "running"}),
        event(7, {"type": "update", "update": updated}),
        chunk(8, "done"),
        event(9, {"type": "prompt_end", "promptId": "p1", "stopReason": "end_turn"}),
        chunk(10, "after the turn"),
    ]
    report = turn_report("p1", events)
    assert report.text_lines("u") == [
        "Hello, done",
        "tool call: Read README.md (read, completed)",
        "stop reason: end_turn",
    ]
    assert report.document()["stopReason"] == "end_turn"


def test_a_failed_turn_names_its_error() -> None:
    end = {"type": "prompt_end", "promptId": "p1", "error": {"code": -32603, "message": "boom"}}
    report = turn_report("p1", [TURN[1], event(3, end)])
    assert report.text_lines("u") == ["error: boom", "stop reason: error"]


def test_events_of_another_turn_are_not_this_ones() -> None:
    report = turn_report("p2", TURN)
    assert not report.started and report.text == "" and report.text_lines("u") == ["still running"]


def test_sse_frames_and_resume_positions() -> None:
    assert frame(event(7, {"type": "prompt"})).startswith(b"id: 7\nevent: prompt\ndata: {")
    assert resume_after(None, None) == 0
    assert resume_after("12", "3") == 12  # a reconnect's Last-Event-ID wins
    assert resume_after(None, "3") == 3
    for bad in ("-1", "x", "1.5", "9" * 19, "١٢"):
        with pytest.raises(ApiError):
            resume_after(bad, None)


def test_inputs_are_checked() -> None:
    assert live_view_url("https://b.example/", "sess_1") == "https://b.example/sessions/sess_1"
    assert wait_of(None) == 60 and wait_of(0) == 0 and wait_of(600) == 600
    for bad in (-1, 601, True, "5"):
        with pytest.raises(ApiError):
            wait_of(bad)
    for wrong in ("", "sess_x", 5, None):
        with pytest.raises(ApiError):
            session_id_of(wrong)
    for bad in ("", "a b", "x" * 256, "é"):
        with pytest.raises(ApiError):
            checked_key(bad)
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})


def _claim(store: Any, tenant: str, key: str, lease: float = 10.0) -> OperationClaim:
    ledger = OperationLedger(store)
    op = OperationKey(tenant, "", "rest", key)
    return OperationClaim(ledger, op, digest({"cwd": "/a"}), repeatable=True, lease=lease)


async def test_operation_claims_in_redis(redis_url: str) -> None:
    store: Any = connect(redis_url)  # TTL and KEYS to check the key, beyond the Store protocol
    try:
        first = _claim(store, "t1", "k")
        assert (await first.decide(wait=5)).claim is Claim.NEW
        # A retry while the first runs waits for it, then gets its outcome.
        waiting = asyncio.ensure_future(_claim(store, "t1", "k").decide(wait=5))
        await asyncio.sleep(0)
        async with first.running():
            await first.settle({"sessionId": "sess_1"})
        assert (await waiting).outcome == {"sessionId": "sess_1"}
        other_body = OperationClaim(first.ledger, first.key, digest({"cwd": "/b"}), repeatable=True)
        assert (await other_body.decide(wait=5)).claim is Claim.CONFLICT
        other = _claim(store, "t2", "k")  # another tenant's key
        assert (await other.decide(wait=5)).claim is Claim.NEW
        ttl = await store.ttl(next(iter(await store.keys("acpb:op:t1:*"))))
        assert RETENTION_SECONDS - 60 < ttl <= RETENTION_SECONDS
        with pytest.raises(RuntimeError):  # a failed request lets its key go
            async with other.running():
                raise RuntimeError("the create failed")
        assert (await _claim(store, "t2", "k").decide(wait=5)).claim is Claim.NEW
    finally:
        await store.aclose()


async def test_a_claim_is_a_lease_renewed_while_running_and_fenced(redis_url: str) -> None:
    store: Any = connect(redis_url)
    try:
        long = _claim(store, "t1", "lease", lease=0.6)
        assert (await long.decide(wait=5)).claim is Claim.NEW
        async with long.running():  # a request longer than the lease keeps its claim
            await asyncio.sleep(1.5)
            assert long.held is not None and await store.get(long.key.name) == long.held.raw
            await long.settle({"sessionId": "sess_long"})
        # A claimer that died (no renewal, no settle): a retry takes the key over once the
        # lease lapsed, and runs.
        dead = _claim(store, "t1", "dead", lease=0.6)
        assert (await dead.decide(wait=5)).claim is Claim.NEW
        retry = _claim(store, "t1", "dead", lease=0.6)
        assert (await asyncio.wait_for(retry.decide(wait=5), 3)).claim is Claim.NEW
        # The first, back from a stall, cannot overwrite what the retry holds (fenced).
        await dead.settle({"sessionId": "sess_dead"})
        assert retry.held is not None and await store.get(retry.key.name) == retry.held.raw
        await retry.settle({"sessionId": "sess_retry"})
        again = await _claim(store, "t1", "dead").decide(wait=5)
        assert again.outcome == {"sessionId": "sess_retry"}
    finally:
        await store.aclose()
