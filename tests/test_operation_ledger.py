"""The operation ledger's transitions, on a real Redis and on the embedded store."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.protocol.operations import fingerprint, operation_id, without_operation
from broker.store.operations import RETENTION_SECONDS, Claim, OperationKey, OperationLedger

from .support.client import wait_for

KEY = OperationKey("t1", "token:abc", "editor-1", "op-1")


async def test_a_key_is_claimed_once_settled_and_answered(store: Any) -> None:
    ledger = OperationLedger(store)
    first = await ledger.begin(KEY, "fp", lease=30)
    assert first.claim is Claim.NEW
    running = await ledger.begin(KEY, "fp", lease=30)
    assert (running.claim, running.lapsed) == (Claim.PENDING, False)
    assert (await ledger.begin(KEY, "other", lease=30)).claim is Claim.CONFLICT
    await ledger.settle(KEY, "fp", {"result": {"stopReason": "end_turn"}})
    done = await ledger.begin(KEY, "fp", lease=30)
    assert (done.claim, done.outcome) == (Claim.DONE, {"result": {"stopReason": "end_turn"}})
    assert (await ledger.begin(KEY, "other", lease=30)).claim is Claim.CONFLICT
    assert 0 < await store.ttl(KEY.name) <= RETENTION_SECONDS


async def test_keys_differ_by_principal_client_and_tenant(store: Any) -> None:
    ledger = OperationLedger(store)
    others = [
        OperationKey("t1", "token:other", "editor-1", "op-1"),
        OperationKey("t1", "token:abc", "editor-2", "op-1"),
        OperationKey("t2", "token:abc", "editor-1", "op-1"),
    ]
    assert (await ledger.begin(KEY, "fp", lease=30)).claim is Claim.NEW
    for key in others:
        assert (await ledger.begin(key, "fp", lease=30)).claim is Claim.NEW
    assert len({key.name for key in [KEY, *others]}) == 4


async def test_a_lapsed_claim_goes_to_one_of_two_retries(store: Any) -> None:
    ledger = OperationLedger(store)
    mine = await ledger.begin(KEY, "fp", lease=30)
    await ledger.lapse(KEY, mine)
    lapsed = await ledger.begin(KEY, "fp", lease=30)
    assert (lapsed.claim, lapsed.lapsed) == (Claim.PENDING, True)
    taken = await asyncio.gather(*(ledger.take_over(KEY, lapsed, 30) for _ in range(2)))
    assert sorted(t is not None for t in taken) == [False, True]
    # Only the holder lets go: a stale entry changes nothing.
    await ledger.forget(KEY, lapsed)
    assert (await ledger.begin(KEY, "fp", lease=30)).claim is Claim.PENDING


async def test_decide_waits_for_the_first_then_answers_its_outcome(store: Any) -> None:
    ledger = OperationLedger(store)
    await ledger.begin(KEY, "fp", lease=30)

    async def settle_soon() -> None:
        await asyncio.sleep(0.3)
        await ledger.settle(KEY, "fp", {"result": 1})

    settling = asyncio.ensure_future(settle_soon())
    entry = await ledger.decide(KEY, "fp", 30, repeatable=False, wait=10)
    assert (entry.claim, entry.outcome) == (Claim.DONE, {"result": 1})
    await settling
    # Still running past the wait: said so, not run.
    key = OperationKey("t1", "p", "c", "op-2")
    await ledger.begin(key, "fp", lease=30)
    waited = await ledger.decide(key, "fp", 30, repeatable=True, wait=0.2)
    assert (waited.claim, waited.lapsed) == (Claim.PENDING, False)


def test_the_id_and_the_input_of_a_request() -> None:
    params = {"sessionId": "s", "_meta": {"operationId": "op-1", "traceparent": "00-x"}}
    assert operation_id(params, remote=False) == "op-1"
    assert operation_id({"operationId": "op-2"}, remote=False) is None  # not negotiated
    assert operation_id({"operationId": "op-2"}, remote=True) == "op-2"
    assert without_operation(params) == {"sessionId": "s", "_meta": {"traceparent": "00-x"}}
    # Neither the id, the trace context nor the keys' order is input.
    assert fingerprint("m", params) == fingerprint("m", {"sessionId": "s"})
    assert fingerprint("m", {"a": 1, "b": 2}) == fingerprint("m", {"b": 2, "a": 1})
    assert fingerprint("m", {"a": 1}) != fingerprint("n", {"a": 1})
    for bad in ("", "x" * 129, "with space", 7):
        try:
            operation_id({"_meta": {"operationId": bad}}, remote=False)
        except Exception as exc:
            assert getattr(exc, "code", None) == -32602
        else:
            raise AssertionError(f"{bad!r} taken")


async def test_an_id_past_the_window_is_forgotten_then_unknown_again(store: Any) -> None:
    """A short window (0.5 s) and tombstone period (1.5 s): within the window the outcome,
    then ``FORGOTTEN`` (no outcome, nothing run), then a new operation."""
    ledger = OperationLedger(store, retention=0.5, tombstone=1.5)
    key = OperationKey("t1", "p", "c", "short")
    assert (await ledger.begin(key, "fp", lease=30)).claim is Claim.NEW
    await ledger.settle(key, "fp", {"result": 1})
    assert (await ledger.begin(key, "fp", lease=30)).claim is Claim.DONE

    async def claim_is(wanted: Claim) -> bool:
        return (await ledger.read(key, "fp")) is None and (
            await ledger.begin(key, "fp", lease=30)
        ).claim is wanted

    # Bounds: the TTLs are 0.5 s and 2 s; generous for busy cores.
    await wait_for(lambda: claim_is(Claim.FORGOTTEN), 10, what="the window passed")
    await wait_for(lambda: claim_is(Claim.NEW), 10, what="the tombstone passed")
    # A claim let go (nothing done) leaves no tombstone: a retry runs as a first request.
    other = OperationKey("t1", "p", "c", "let-go")
    await ledger.forget(other, await ledger.begin(other, "fp", lease=30))
    assert (await ledger.begin(other, "fp", lease=30)).claim is Claim.NEW
    # No tombstone period: forgotten at once.
    bare = OperationLedger(store, retention=0.5, tombstone=0)
    gone = OperationKey("t1", "p", "c", "bare")
    await bare.settle(gone, "fp", {"result": 1}, held=await bare.begin(gone, "fp", lease=30))
    assert await store.exists(gone.tombstone) == 0
