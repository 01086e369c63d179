"""Seqs never given twice (store/floors.py): the floors' memory, the append script taking
the seq after the floor, and every reader taking the seqs a rewound log skipped as nothing.

A rewind is made by hand here, as a replica that missed the last writes would hold the log:
its last entries deleted and the snapshot's seq set back. ``tests/test_rewind.py`` makes a
real one with a master and a replica.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.clients.resume import BridgeState, TrackedSession
from broker.front.fanout import FanoutHub
from broker.ops import metrics
from broker.protocol.jsonrpc import INVALID_PARAMS, RpcError
from broker.protocol.render import LOG_END_DATA, POSITION_META, check_position
from broker.store.archive import ArchiveCorrupt, ArchivedLog, decode, encode, entries_between
from broker.store.client import connect
from broker.store.events import EventType, LogEvent
from broker.store.floors import SeqFloors
from broker.store.keys import SessionKeys
from broker.store.log import SessionLog

from .support.client import wait_for

CREATED = {"type": EventType.CREATED, "cwd": "/w", "agent": "demo", "kind": "shell"}


def _update(text: str) -> dict[str, Any]:
    return {
        "type": EventType.UPDATE,
        "update": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": text},
        },
    }


def _rewinds(found_by: str) -> float:
    return metrics.LOG_REWINDS.labels(found_by)._value.get()


# -- the floors' memory --------------------------------------------------------------------


def test_a_floor_is_the_highest_seq_acknowledged_and_sources_raise_it() -> None:
    floors = SeqFloors(limit=2)
    assert floors.floor("s1") == 0
    floors.reached("s1", 5)
    floors.reached("s1", 3)  # an older acknowledgement does not lower it
    assert floors.floor("s1") == 5
    floors.add_source(lambda tenant, sid: 9 if (tenant, sid) == ("t", "s1") else 0)
    assert floors.asked("t", "s1") == 9 and floors.floor("s1") == 5
    assert floors.asked("t", "s2") == 0
    floors.reached("s2", 1)
    floors.reached("s3", 1)  # past the limit: the oldest remembered goes
    assert floors.floor("s1") == 0 and floors.floor("s3") == 1
    floors.forget("s3")
    assert floors.floor("s3") == 0


# -- archives with gaps --------------------------------------------------------------------


def test_an_archive_keeps_a_log_with_skipped_seqs_and_finds_ranges_in_it() -> None:
    entries = [(1, 10, "a"), (2, 11, "b"), (6, 12, "c"), (7, 13, "d")]
    log = ArchivedLog("t", "s", "e", 7, entries)
    back = decode(encode(log), "t", "s")
    assert back.seq == 7 and list(back.entries) == entries
    assert entries_between(back, 0, 7) == entries
    assert entries_between(back, 1, 6) == entries[1:3]
    assert entries_between(back, 3, 7) == entries[2:]  # from a lost seq: what follows
    assert entries_between(back, 7, 7) == []
    contiguous = ArchivedLog("t", "s", "e", 2, entries[:2])
    assert entries_between(decode(encode(contiguous), "t", "s"), 1, 2) == entries[1:2]


def test_an_archive_out_of_order_or_shorter_than_its_header_is_corrupt() -> None:
    shuffled = ArchivedLog("t", "s", "e", 2, [(2, 1, "b"), (1, 1, "a")])
    with pytest.raises(ArchiveCorrupt, match="after"):
        decode(encode(shuffled), "t", "s")
    headless = ArchivedLog("t", "s", "e", 3, [(2, 1, "b"), (3, 1, "c")])
    with pytest.raises(ArchiveCorrupt, match="entry 1 has seq 2"):
        decode(encode(headless), "t", "s")
    short = ArchivedLog("t", "s", "e", 9, [(1, 1, "a"), (5, 1, "b")])
    with pytest.raises(ArchiveCorrupt, match="ends at seq 5, not 9"):
        decode(encode(short), "t", "s")


# -- the append script ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _log(url: str | None) -> AsyncIterator[tuple[Any, SessionLog]]:
    store = connect(url)
    try:
        yield store, SessionLog(store)
    finally:
        await store.aclose()


async def _rewind(store: Any, session_id: str, to: int) -> None:
    """Make the log what a replica that missed everything after ``to`` holds."""
    keys = SessionKeys("t", session_id)
    last = int(await store.hget(keys.snapshot, "seq"))
    await store.xdel(keys.log, *(f"{seq}-0" for seq in range(to + 1, last + 1)))
    await store.hset(keys.snapshot, "seq", to)


@pytest.mark.parametrize("batch", [False, True])
async def test_an_append_after_a_rewind_takes_the_seq_after_the_last_acknowledged(
    store_kind: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, batch: bool
) -> None:
    url = request.getfixturevalue("redis_url") if store_kind == "redis" else None
    caplog.set_level(logging.WARNING)
    async with _log(url) as (store, log):
        await log.create("t", "s", CREATED)
        for i in range(4):
            await log.append("t", "s", _update(f"kept {i}"))  # seqs 2-5
        await _rewind(store, "s", 3)  # 4 and 5 lost
        before = _rewinds("append")
        if batch:
            results = await log.append_many([("t", "s", _update("new 0"), "")] * 2)
            seqs = [r.seq for r in results if not isinstance(r, Exception)]
        else:
            seqs = [(await log.append("t", "s", _update("new 0"))).seq]
            seqs.append((await log.append("t", "s", _update("new 1"))).seq)
        assert seqs == [6, 7]
        assert _rewinds("append") == before + 1
        warned = [r for r in caplog.records if "Redis lost acknowledged writes" in r.message]
        assert len(warned) == 1 and "ends at seq 3, behind seq 5" in warned[0].message

        # Readers take the skipped seqs as nothing there.
        assert [e.seq for e in await log.read("t", "s", after=3)] == [6, 7]
        assert [e.seq for e in await log.read("t", "s", after=4)] == [6, 7]
        assert [e.seq for e in await log.read("t", "s", after=2, until=5)] == [3]
        whole = await log.read_whole("t", "s")
        assert whole is not None and whole.seq == 7
        assert [e[0] for e in whole.entries] == [1, 2, 3, 6, 7]

        # Another process that never saw seqs 4 and 5 appends after the log's end.
        other = SessionLog(store)
        assert (await other.append("t", "s", _update("other"))).seq == 8


async def test_a_floor_is_left_only_past_the_log_and_its_floor_in_its_epoch(
    redis_url: str,
) -> None:
    async with _log(redis_url) as (store, log):
        await log.create("t", "s", CREATED)
        await log.append("t", "s", _update("one"))  # seq 2
        epoch = (await log.snapshot("t", "s")).epoch
        assert not await log.leave_floor("t", "s", 2, epoch)  # the log is there already
        assert not await log.leave_floor("t", "s", 9, "another-log")
        assert not await log.leave_floor("t", "nobody", 9, epoch)
        assert await log.leave_floor("t", "s", 9, epoch)
        assert not await log.leave_floor("t", "s", 7, epoch)  # below the floor left
        snapshot = await log.snapshot("t", "s")
        assert (snapshot.seq, snapshot.floor, snapshot.given) == (2, 9, 9)  # resumable to 9
        assert (await SessionLog(store).append("t", "s", _update("two"))).seq == 10


async def test_a_front_appends_past_what_its_hub_handed_out(redis_url: str) -> None:
    """A front that appended nothing itself passes the seq its hub handed out as the floor."""
    async with _log(redis_url) as (store, log):
        await log.create("t", "s", CREATED)
        for i in range(4):
            await log.append("t", "s", _update(f"kept {i}"))
        await _rewind(store, "s", 3)
        async with _log(redis_url) as (_, front):
            front.add_floor_source(lambda tenant, sid: 5 if sid == "s" else 0)
            assert (await front.append("t", "s", _update("title"))).seq == 6


# -- a position ahead of the log -----------------------------------------------------------


def test_a_position_ahead_of_the_log_is_refused_with_the_logs_end() -> None:
    with pytest.raises(RpcError) as refused:
        check_position(9, "e", log_epoch="e", head=7)
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.data == {LOG_END_DATA: {"seq": 7, "epoch": "e"}}
    check_position(7, "e", log_epoch="e", head=7)


def _bridge_with(position: tuple[int, str]) -> BridgeState:
    state = BridgeState()
    state.version = 1
    state.sessions["s"] = TrackedSession("s", "/w")
    state.positions["s"] = position
    return state


def test_the_bridge_resumes_from_the_logs_end_when_its_position_was_lost() -> None:
    state = _bridge_with((9, "e"))
    error = {
        "code": INVALID_PARAMS,
        "message": "ahead",
        "data": {LOG_END_DATA: {"seq": 7, "epoch": "e"}},
    }
    again = state.resume_from_log_end("s", error)
    assert again is not None and again["method"] == "session/resume"
    assert again["params"]["_meta"] == {"acpBroker/replayAfter": {"seq": 7, "epoch": "e"}}
    # What the log gets next (seq 10, past every seq given out) reaches the editor.
    update = {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk"}}
    update["_meta"] = {POSITION_META: {"seq": 10, "epoch": "e"}}
    routed = state.from_broker({"jsonrpc": "2.0", "method": "session/update", "params": update})
    assert routed.to_editor and state.positions["s"] == (10, "e")


@pytest.mark.parametrize(
    "error",
    [
        {"code": INVALID_PARAMS, "message": "epoch mismatch"},
        {"code": INVALID_PARAMS, "message": "x", "data": {LOG_END_DATA: {"seq": 7, "epoch": "f"}}},
        {"code": INVALID_PARAMS, "message": "x", "data": {LOG_END_DATA: {"seq": 9, "epoch": "e"}}},
        {"code": -32002, "message": "gone", "data": {LOG_END_DATA: {"seq": 7, "epoch": "e"}}},
        None,
    ],
)
def test_the_bridge_gives_up_on_other_refusals(error: Any) -> None:
    assert _bridge_with((9, "e")).resume_from_log_end("s", error) is None


# -- a front's fan-out hub -----------------------------------------------------------------


class _Window:
    """A subscriber that keeps the seqs it is handed."""

    id = "window"

    def __init__(self) -> None:
        self.seqs: list[int] = []

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        self.seqs.append(event.seq)


async def test_a_hub_ahead_of_a_rewound_log_says_so_once_and_skips_nothing_after(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with _log(redis_url) as (store, host):
        await host.create("t", "s", CREATED)
        front_store = connect(redis_url)
        front = SessionLog(front_store)
        hub = FanoutHub(front_store, front, check_interval=3600)
        await hub.start()
        try:
            window = _Window()
            assert await hub.join("t", "s", window) == 1
            for i in range(4):
                await host.append("t", "s", _update(f"kept {i}"))
            await wait_for(lambda: window.seqs == [2, 3, 4, 5], what="the events")
            await _rewind(store, "s", 3)
            before = _rewinds("fanout")
            for _ in range(3):  # quiet: compared with the snapshot each time
                await hub.check_positions()
            assert _rewinds("fanout") == before + 1
            warned = [r for r in caplog.records if "delivered here" in r.message]
            assert len(warned) == 1, warned
            # The hub left what it handed out as the session's floor: an appender that never
            # saw seqs 4 and 5 (a host that took the session over) goes past it.
            assert await store.hget(SessionKeys("t", "s").snapshot, "floor") == "5"
            taken_over = SessionLog(store)
            assert (await taken_over.append("t", "s", _update("taken over"))).seq == 6
            assert await store.hget(SessionKeys("t", "s").snapshot, "floor") is None
            # The front's own append (a title, say) and the first host's go on after it.
            assert (await front.append("t", "s", _update("title"))).seq == 7
            assert (await host.append("t", "s", _update("after"))).seq == 8
            await wait_for(lambda: window.seqs[-1:] == [8], what="the new events")
            assert window.seqs == [2, 3, 4, 5, 6, 7, 8]
        finally:
            await hub.stop()
            await front_store.aclose()
