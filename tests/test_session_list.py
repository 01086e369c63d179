"""session/list: keyset pages over the index, cwd filters, signed cursors."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.front.acp.listing import ListQuery
from broker.front.pages import PageCache
from broker.protocol.jsonrpc import REQUEST_CANCELLED
from broker.serve import Broker
from broker.store.client import commands, connect
from broker.store.cursors import fingerprint
from broker.store.events import EventType
from broker.store.index import (
    ACP_LISTING,
    cwd_listing,
    decode_row,
    encode_row,
    lower_bound,
    member,
    session_info,
    session_info_json,
    stored_member,
)
from broker.store.keys import TenantKeys
from broker.store.log import new_session_id

from .conftest import make_settings
from .support.client import RawClient, wait_for
from .support.nodes import asked_of_the_cache, holding, running_front


async def _seed(broker: Broker, count: int, *, distinct_times: int) -> list[tuple[int, str]]:
    """``count`` sessions whose updatedAt takes only ``distinct_times`` values (many ties)."""
    base = 1_790_000_000_000
    made = []
    for i in range(count):
        session_id = new_session_id()
        await broker.log.create("default", session_id, {"type": EventType.CREATED, "cwd": "/seed"})
        snapshot = await broker.log.snapshot("default", session_id)
        updated = base + (i % distinct_times) * 1000
        await broker.index.project(dataclasses.replace(snapshot, updated_ms=updated), force=True)
        made.append((updated, session_id))
    return made


async def _walk(client: RawClient, params: dict) -> tuple[list[dict], int]:
    sessions, pages, cursor = [], 0, None
    while True:
        reply = await client.call(
            "session/list", {**params, **({"cursor": cursor} if cursor else {})}
        )
        result = reply["result"]
        sessions += result["sessions"]
        pages += 1
        cursor = result.get("nextCursor")
        if cursor is None:
            return sessions, pages


async def test_walking_1000_sessions_with_tied_times_lists_each_once_newest_first(
    broker: Broker, url: str
) -> None:
    made = await _seed(broker, 1000, distinct_times=7)
    client = await RawClient.initialized(url)
    sessions, pages = await _walk(client, {})
    ids = [s["sessionId"] for s in sessions]
    assert len(ids) == 1000 and set(ids) == {sid for _, sid in made}
    assert ids == _newest_first(made)
    assert pages == 1000 // broker.settings.list_page_size
    assert all(s["updatedAt"].endswith("Z") and "T" in s["updatedAt"] for s in sessions)
    await client.close()


async def test_empty_listing_has_empty_sessions_and_no_cursor(url: str) -> None:
    client = await RawClient.initialized(url)
    reply = await client.call("session/list", {})
    assert reply["result"] == {"sessions": []}
    await client.close()


async def test_cwd_filter_matches_exactly_with_trailing_separator_normalized(url: str) -> None:
    client = await RawClient.initialized(url)

    async def new(cwd: str, dirs: list[str] | None = None) -> str:
        params = {"cwd": cwd, "mcpServers": [], "additionalDirectories": dirs or []}
        return (await client.call("session/new", params))["result"]["sessionId"]

    exact = await new("/srv/app")
    slashed = await new("/srv/app/")
    await new("/srv/app/sub")
    await new("/srv/other", ["/srv/app"])
    await new("/srv/application")
    for cwd in ("/srv/app", "/srv/app/", "/srv/app//"):
        sessions, _ = await _walk(client, {"cwd": cwd})
        assert {s["sessionId"] for s in sessions} == {exact, slashed}, cwd
    with_dirs, _ = await _walk(client, {"cwd": "/srv/other"})
    assert with_dirs[0]["additionalDirectories"] == ["/srv/app"]
    for bad in ("srv/app", "", "./x", 42):
        reply = await client.call("session/list", {"cwd": bad})
        assert reply["error"]["code"] == -32602, bad
    await client.close()


async def test_tampered_truncated_and_foreign_cursors_are_invalid_params(
    broker: Broker, url: str
) -> None:
    await _seed(broker, 120, distinct_times=3)
    client = await RawClient.initialized(url)
    first = (await client.call("session/list", {}))["result"]
    cursor = first["nextCursor"]
    payload, tag = cursor.split(".")
    flipped = "A" if payload[5] != "A" else "B"
    forged = [
        cursor[:-3],  # truncated
        payload[:5] + flipped + payload[6:] + "." + tag,  # tampered position
        payload + "." + tag[::-1],  # tampered signature
        "not-a-cursor",
        "",
        ".",
        # Genuine signature, but for another tenant's listing.
        broker.methods.cursors.encode("0:x", fingerprint("other-tenant", "acp", {})),
    ]
    for bad in forged:
        reply = await client.call("session/list", {"cursor": bad})
        assert reply["error"]["code"] == -32602, bad
    # A cursor of the unfiltered listing is no good for a filtered one, and vice versa.
    reply = await client.call("session/list", {"cwd": "/seed", "cursor": cursor})
    assert reply["error"]["code"] == -32602
    # The genuine cursor still works.
    assert "result" in await client.call("session/list", {"cursor": cursor})
    await client.close()


async def test_deleted_sessions_leave_the_list_and_updates_move_a_session_first(url: str) -> None:
    client = await RawClient.initialized(url)
    ids = []
    for _ in range(3):
        ids.append(await client.new_session("/x"))
    listed = [s["sessionId"] for s in (await client.call("session/list", {}))["result"]["sessions"]]
    assert set(listed) == set(ids)
    await client.call(
        "session/prompt", {"sessionId": ids[0], "prompt": [{"type": "text", "text": "/notool hi"}]}
    )
    listed = [s["sessionId"] for s in (await client.call("session/list", {}))["result"]["sessions"]]
    assert listed[0] == ids[0]
    await client.call("session/delete", {"sessionId": ids[1]})
    listed = [s["sessionId"] for s in (await client.call("session/list", {}))["result"]["sessions"]]
    assert ids[1] not in listed and len(listed) == 2
    await client.close()


ROW_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)


@given(
    st.fixed_dictionaries(
        {
            "sessionId": st.just("sess_1"),
            "cwd": st.just("/w"),
            "additionalDirectories": st.lists(ROW_TEXT, max_size=2),
            "title": st.none() | ROW_TEXT,
            "updatedAt": st.just("2026-11-30T05:00:00.000Z"),
            "createdAt": st.just("2026-11-30T04:00:00.000Z"),
            "status": st.sampled_from(["RUNNING", "STOPPED", "DELETED"]),
            "kind": ROW_TEXT,
            "agent": ROW_TEXT,
            "_meta": st.dictionaries(ROW_TEXT, ROW_TEXT, max_size=2),
        }
    )
)
def test_a_stored_row_reads_back_whole_and_lists_as_its_session_info(row: dict) -> None:
    stored = encode_row(row)
    assert decode_row(stored) == row
    # The SessionInfo line holds no control character: an ACP listing's member splits at
    # the first \x01 (see index.stored_member).
    assert not any(ord(c) < 0x20 for c in stored.partition("\n")[0])
    assert json.loads(session_info_json(stored)) == session_info(row)
    # A row stored as one JSON object (the earlier format) reads the same way.
    assert decode_row(json.dumps(row)) == row
    assert json.loads(session_info_json(json.dumps(row))) == session_info(row)


POSITIONS = st.lists(
    st.tuples(
        st.integers(1_790_000_000_000, 1_790_000_000_004),  # few times: many ties
        st.text("0123456789abcdef", min_size=1, max_size=4).map(lambda h: "sess_" + h),
    ),
    min_size=1,
    max_size=30,
    unique_by=lambda p: p[1],
)


@given(POSITIONS, st.text(max_size=20))
def test_members_carrying_their_info_sort_by_position_and_pages_resume_past_them(
    positions: list[tuple[int, str]], title: str
) -> None:
    """What ZRANGE BYLEX does with an ACP listing, in Python (Redis compares bytes, which
    for UTF-8 is the order of code points)."""
    info = json.dumps({"title": title})
    at = {sid: member(ms, sid) for ms, sid in positions}
    stored = {sid: stored_member(ACP_LISTING, at[sid], info) for sid in at}
    by_position = sorted(at, key=at.__getitem__)
    assert sorted(at, key=stored.__getitem__) == by_position
    for k, sid in enumerate(by_position):
        bound = lower_bound(at[sid])[1:]  # "(" dropped: exclusive
        past = [other for other in by_position if stored[other] > bound]
        assert past == by_position[k + 1 :]


# -- a page read without a task (the front's miss path) --------------------------------------


@contextlib.asynccontextmanager
async def _uncached_broker(
    redis_url: str, timeout: float = 5.0, **overrides: Any
) -> AsyncIterator[Broker]:
    """A broker with no page cache (every page read from Redis; ``list_cache=True``: with
    it, subscribed) on a store whose commands time out after ``timeout`` (the bare
    connection's reply timeout with them)."""
    store = connect(redis_url, timeout=timeout)
    overrides.setdefault("list_cache", False)
    try:
        async with running_front(Broker(make_settings(**overrides), redis=store)) as node:
            yield node
    finally:
        await store.aclose()


REPLY_TIMEOUT = 0.5
"""The stall test's reply timeout (the others keep the default: a busy machine)."""


def _counted_reads(broker: Broker) -> dict[str, int]:
    """How the broker's page reads go: dispatched (``SessionIndex.page``) or begun from the
    step that read the request (``begin_page``)."""
    counts = {"dispatched": 0, "at once": 0}
    page, begin = broker.index.page, broker.index.begin_page

    async def dispatched(*args: Any, **kwargs: Any) -> Any:
        counts["dispatched"] += 1
        return await page(*args, **kwargs)

    def at_once(*args: Any, **kwargs: Any) -> Any:
        counts["at once"] += 1
        return begin(*args, **kwargs)

    broker.index.page = dispatched
    broker.index.begin_page = at_once
    return counts


async def _bare_transport(broker: Broker) -> Any:
    direct = broker.index._direct
    assert direct is not None
    await wait_for(lambda: direct._open() is not None, what="the shared connection")
    connection = direct._open()
    assert connection is not None and connection._transport is not None
    return connection, connection._transport


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_page_read_from_redis_is_answered_without_a_task_and_alike(
    redis_url: str, store_kind: str
) -> None:
    async with _uncached_broker(redis_url, list_page_size=5) as broker:
        await _seed(broker, 12, distinct_times=12)
        client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
        counts = _counted_reads(broker)
        first = (await client.call("session/list", {}))["result"]  # opens the connection
        assert counts == {"dispatched": 1, "at once": 1}  # none open yet: dispatched
        for _ in range(3):
            assert (await client.call("session/list", {}))["result"] == first
        walked, pages = await _walk(client, {})
        assert pages == 3 and counts == {"dispatched": 1, "at once": 4 + pages}
        assert [s["sessionId"] for s in walked][: len(first["sessions"])] == [
            s["sessionId"] for s in first["sessions"]
        ]
        assert len(walked) == 12
        # The same answer as the dispatched read's, byte for byte: a v2 client too.
        query = ListQuery({}, ACP_LISTING, None, "")
        via_methods, _ = await broker.methods.listing.source.read("default", query)
        assert json.loads(via_methods)["sessions"] == first["sessions"]
        assert not client.inbox
        await client.close()


@contextlib.asynccontextmanager
async def _paged(
    redis_url: str, sessions: int, timeout: float = 5.0
) -> AsyncIterator[tuple[Broker, PageCache, RawClient, list[str]]]:
    """A broker with its page cache (pages of 5, subscribed) over ``sessions`` sessions, a
    client of it, and the sessions' ids as a walk must list them: newest first."""
    async with _uncached_broker(redis_url, timeout, list_cache=True, list_page_size=5) as broker:
        made = await _seed(broker, sessions, distinct_times=sessions)
        pages = broker.methods.pages
        assert pages is not None
        await wait_for(lambda: pages.live)
        client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
        try:
            yield broker, pages, client, _newest_first(made)
            assert not client.inbox
        finally:
            await client.close()


def _newest_first(made: list[tuple[int, str]]) -> list[str]:
    return [sid for _, sid in sorted(made, key=lambda m: (-m[0], m[1]))]


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_client_paging_through_a_list_waits_for_redis_on_its_first_page_only(
    redis_url: str, store_kind: str
) -> None:
    async with _paged(redis_url, 12) as (_, pages, client, expected):
        before = asked_of_the_cache()
        walked: list[dict[str, Any]] = []
        cursor = None
        for kept in (2, 3, 3):  # the page asked for, and the one after it read ahead
            params: dict[str, Any] = {"cursor": cursor} if cursor else {}
            reply = (await client.call("session/list", params))["result"]
            walked += reply["sessions"]
            cursor = reply.get("nextCursor")
            await wait_for(holding(pages, kept))
        assert cursor is None
        after = asked_of_the_cache()
        assert {k: after[k] - before[k] for k in after} == {"hit": 2, "miss": 1, "bypass": 0}
        assert [s["sessionId"] for s in walked] == expected  # each once, newest first


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_client_paging_back_to_back_waits_for_each_read_ahead_not_reading_twice(
    redis_url: str, store_kind: str
) -> None:
    async with _paged(redis_url, 23) as (broker, _, client, expected):
        await client.call("session/list", {"cwd": "/elsewhere"})  # the bare connection open
        reads = _counted_reads(broker)
        before = asked_of_the_cache()
        walked, count = await _walk(client, {})  # each ask as soon as the last is answered
        after = asked_of_the_cache()
        assert count == 5
        assert {k: after[k] - before[k] for k in after} == {"hit": 4, "miss": 1, "bypass": 0}
        # each page read once: the first as asked, from the step that read it; the others
        # read ahead (through the index's page reads, in a task of their own)
        assert reads == {"at once": 1, "dispatched": 4}
        assert [s["sessionId"] for s in walked] == expected


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_an_ask_waiting_for_a_stuck_read_ahead_reads_the_page_itself_at_its_bound(
    redis_url: str, store_kind: str
) -> None:
    async with _paged(redis_url, 12, REPLY_TIMEOUT) as (broker, pages, client, expected):
        await client.call("session/list", {"cwd": "/elsewhere"})  # the bare connection open
        stuck, read = asyncio.Event(), broker.index.page
        held: list[str | None] = []

        async def page(tenant: str, listing: str, after: str | None, *a: Any, **kw: Any) -> Any:
            if after is not None and not held:  # the first read ahead: a store that stalls
                held.append(after)
                await stuck.wait()
            return await read(tenant, listing, after, *a, **kw)

        broker.index.page = page
        first = (await client.call("session/list", {}))["result"]
        await wait_for(lambda: bool(held) and pages.reading_ahead(_next_key(first)))
        started = time.monotonic()
        second = (await client.call("session/list", {"cursor": first["nextCursor"]}))["result"]
        waited = time.monotonic() - started
        assert REPLY_TIMEOUT * 0.9 <= waited < REPLY_TIMEOUT * 2 + 1.0, waited
        ids = [s["sessionId"] for s in first["sessions"] + second["sessions"]]
        assert ids == expected[:10]
        stuck.set()  # the stuck read lands at last: nothing more is sent to the client
        await wait_for(lambda: not pages.reading_ahead(_next_key(first)))


def _next_key(page: dict[str, Any]) -> tuple[Any, ...]:
    """The page cache's key of the page after ``page`` (default tenant, no cwd, pages of 5)."""
    return ("default", "acp", None, page["nextCursor"], 5)


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_stalled_read_is_answered_with_the_stores_error_after_one_timeout(
    redis_url: str, store_kind: str
) -> None:
    """The read goes one way (the bare connection): a stall fails it after that
    connection's timeout, as the store's "try again", not read again through the client
    (which would wait as long again)."""
    async with _uncached_broker(redis_url, REPLY_TIMEOUT) as broker:
        await _seed(broker, 5, distinct_times=5)
        client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
        expected = (await client.call("session/list", {}))["result"]
        raw, transport = await _bare_transport(broker)
        transport.pause_reading()  # the server's reply is never read: a stall, to this front
        started = time.monotonic()
        failed = await client.call("session/list", {})
        waited = time.monotonic() - started
        assert "unreachable" in failed["error"]["message"], failed
        assert REPLY_TIMEOUT * 0.9 <= waited < REPLY_TIMEOUT + 1.0, waited
        assert raw.lost  # given up; the next read opens another
        assert (await client.call("session/list", {}))["result"] == expected
        assert (await client.call("session/list", {}))["result"] == expected
        assert not client.inbox
        await client.close()


async def _strip_infos(broker: Broker, listing: str) -> None:
    """Rewrite the default tenant's ``listing`` as bare positions, as members were stored
    before they carried their SessionInfo (no announcement: the cache is not told)."""
    key = TenantKeys("default").index(listing)
    members = await commands(broker.redis).zrange(key, 0, -1, withscores=True)
    await commands(broker.redis).delete(key)
    await commands(broker.redis).zadd(key, {m.partition("\x01")[0]: score for m, score in members})


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_miss_read_again_after_the_bare_read_is_counted_once(
    redis_url: str, store_kind: str
) -> None:
    async with _uncached_broker(redis_url, REPLY_TIMEOUT, list_cache=True) as broker:
        await _seed(broker, 4, distinct_times=4)
        listing = cwd_listing("/seed")
        text, _ = await broker.methods.listing.source.read(
            "default", ListQuery({}, listing, None, "")
        )
        expected = json.loads(text)
        client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
        counts = _counted_reads(broker)
        before = asked_of_the_cache()
        assert (await client.call("session/list", {}))["result"] == expected  # read at once
        # Members of an earlier format: read again with their rows.
        await _strip_infos(broker, listing)
        reply = (await client.call("session/list", {"cwd": "/seed"}))["result"]
        assert reply["sessions"] == expected["sessions"]
        # A stalled bare read: failed as the store's "try again" after its one timeout (not
        # sent again another way); the next read opens a fresh connection.
        raw, transport = await _bare_transport(broker)
        transport.pause_reading()
        failed = await client.call("session/list", {"cwd": "/other"})
        assert "unreachable" in failed["error"]["message"], failed
        assert raw.lost
        assert (await client.call("session/list", {"cwd": "/other"}))["result"]["sessions"] == []
        assert counts == {"dispatched": 3, "at once": 4}  # a cwd's listing: read in a task
        after = asked_of_the_cache()
        assert {k: after[k] - before[k] for k in after} == {"hit": 0, "miss": 4, "bypass": 0}
        # Each was kept once read again: a hit now.
        assert (await client.call("session/list", {"cwd": "/seed"}))["result"] == reply
        assert asked_of_the_cache()["hit"] == after["hit"] + 1
        assert not client.inbox
        await client.close()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_read_in_flight_is_cancelled_by_its_client_and_by_its_connection_s_end(
    redis_url: str, store_kind: str
) -> None:
    async with _uncached_broker(redis_url) as broker:
        await _seed(broker, 5, distinct_times=5)
        client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
        expected = (await client.call("session/list", {}))["result"]
        raw, transport = await _bare_transport(broker)
        transport.pause_reading()
        await client.send({"jsonrpc": "2.0", "id": 7, "method": "session/list", "params": {}})
        await wait_for(lambda: raw._waiting, what="the page read to be sent")
        cancel = {"requestId": 7}
        await client.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": cancel})
        refused = await client.reply_to(7)
        assert refused["error"]["code"] == REQUEST_CANCELLED
        transport.resume_reading()
        assert (await client.call("session/list", {}))["result"] == expected
        assert all(m.get("id") != 7 for m in client.inbox)  # answered once: the refusal
        # A read in flight as its connection closes: dropped, nothing left behind.
        transport.pause_reading()
        await client.send({"jsonrpc": "2.0", "id": 8, "method": "session/list", "params": {}})
        await wait_for(lambda: raw._waiting, what="the page read to be sent")
        await client.close()
        await wait_for(lambda: not broker.connections, what="the connection to end")
        transport.resume_reading()
        await wait_for(lambda: not raw._waiting, what="the reply to be read and dropped")
        again = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
        assert (await again.call("session/list", {}))["result"] == expected
        await again.close()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_reply_timeout_past_the_request_deadline_keeps_the_dispatched_read(
    redis_url: str, store_kind: str
) -> None:
    # Only their order matters (the reply timeout past the deadline); both far past what a
    # page read takes on a loaded machine, so no read is cut by either.
    async with _uncached_broker(redis_url, 20.0, request_timeout=10.0) as broker:
        await _seed(broker, 3, distinct_times=3)
        client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
        counts = _counted_reads(broker)
        for _ in range(3):
            assert len((await client.call("session/list", {}))["result"]["sessions"]) == 3
        assert counts == {"dispatched": 3, "at once": 0}
        await client.close()
