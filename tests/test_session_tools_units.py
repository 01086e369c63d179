"""Pure parts of the session tools: turn reports, SSE frames and positions, idempotency keys,
inputs; and the idempotency keys against a real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.errors import ApiError
from broker.front.http.event_stream import frame, resume_after
from broker.front.http.idempotency import Claim, IdempotencyKeys, checked_key, fingerprint
from broker.front.http.session_tools import live_view_url
from broker.front.http.tool_models import session_id_of, wait_of
from broker.front.http.turns import turn_report
from broker.store.client import connect
from broker.store.events import LogEvent
from broker.store.idempotency import idempotency_key

from .support.client import LOADED_WAIT, wait_for


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
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})


async def test_idempotency_keys_in_redis(redis_url: str) -> None:
    store: Any = connect(redis_url)  # TTL and KEYS to check the key, beyond the Store protocol
    keys = IdempotencyKeys(store, wait=5)
    try:
        claim = await keys.claim("t1", "k", {"cwd": "/a"})
        assert isinstance(claim, Claim)
        # A retry while the first runs waits for it, then gets its session.
        looked: list[str | None] = []  # what the retry read of the key
        get = keys.records.get

        async def watched(tenant: str, key: str) -> str | None:
            looked.append(await get(tenant, key))
            return looked[-1]

        keys.records.get = watched  # type: ignore[method-assign]
        waiting = asyncio.ensure_future(keys.claim("t1", "k", {"cwd": "/a"}))
        await wait_for(lambda: looked, what="the retry to find the first's claim")
        keys.records.get = get  # type: ignore[method-assign]
        await keys.settle(claim, "sess_1")
        assert await waiting == "sess_1"
        assert await keys.claim("t1", "k", {"cwd": "/a"}) == "sess_1"
        with pytest.raises(ApiError) as other_body:
            await keys.claim("t1", "k", {"cwd": "/b"})
        assert other_body.value.code == "invalid_argument"
        other = await keys.claim("t2", "k", {"cwd": "/a"})  # another tenant's key
        assert isinstance(other, Claim)
        ttl = await store.ttl(next(iter(await store.keys("acpb:idem:t1:*"))))
        assert 24 * 3600 - 60 < ttl <= 24 * 3600
        with pytest.raises(RuntimeError):  # a failed create lets its key go
            async with keys.creating(other):
                raise RuntimeError("the create failed")
        assert isinstance(await keys.claim("t2", "k", {"cwd": "/a"}), Claim)
    finally:
        await store.aclose()


async def test_a_claim_is_a_lease_renewed_while_creating_and_fenced(redis_url: str) -> None:
    store: Any = connect(redis_url)
    keys = IdempotencyKeys(store, wait=5, lease=0.6)
    try:
        claim = await keys.claim("t1", "lease", {"cwd": "/a"})
        assert isinstance(claim, Claim)
        async with keys.creating(claim):  # a create longer than the lease keeps its claim
            await asyncio.sleep(1.5)  # held past the 0.6 s lease on purpose: renewed meanwhile
            assert await store.get(idempotency_key(claim.tenant, claim.key)) == claim.pending
        # A claimer that died (no renewal, no settle): a retry takes the key over once the
        # lease lapsed, and creates.
        dead = await keys.claim("t1", "dead", {"cwd": "/a"})
        assert isinstance(dead, Claim)
        retry = await asyncio.wait_for(keys.claim("t1", "dead", {"cwd": "/a"}), LOADED_WAIT)
        assert isinstance(retry, Claim) and retry != dead
        # The first, back from a stall, cannot overwrite what the retry holds (fenced).
        await keys.settle(dead, "sess_dead")
        assert await store.get(idempotency_key(retry.tenant, retry.key)) == retry.pending
        await keys.settle(retry, "sess_retry")
        assert await keys.claim("t1", "dead", {"cwd": "/a"}) == "sess_retry"
    finally:
        await store.aclose()
