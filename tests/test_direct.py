"""Calls on the own client's connections (``DirectCalls``, ``StoreCalls``): the same replies
as redis-py's client path, and they recover from a cut."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.store.client import commands, connect
from broker.store.direct import DirectCalls, direct_calls
from broker.store.events import EventType, SessionSnapshot
from broker.store.index import ACP_LISTING, SessionIndex, decode_row
from broker.store.keys import SessionKeys, TenantKeys
from broker.store.log import SessionLog, SessionMissing

from .support.client import wait_for
from .support.redis_server import password_server


def _redis_py(url: str) -> Any:
    """redis-py's own client of ``url``: the path TLS and a Sentinel master take."""
    return Redis.from_url(url, decode_responses=True)


async def _cut_every_connection(url: str) -> None:
    """Close every client connection of the server at ``url`` but the one asking."""
    admin = _redis_py(url)
    try:
        await admin.client_kill_filter(_type="normal", skipme=True)
    finally:
        await admin.aclose()


def _snapshot(i: int) -> SessionSnapshot:
    return SessionSnapshot(
        tenant="t",
        session_id=f"sess_{i:04d}",
        epoch="e",
        seq=1,
        cwd="/w",
        created_ms=1_000 + i,
        updated_ms=1_000 + i,
    )


async def _indexed(store: Any, count: int) -> SessionIndex:
    index = SessionIndex(store)
    for i in range(count):
        await index.project(_snapshot(i))
    return index


@contextlib.asynccontextmanager
async def _indexed_store(url: str, count: int) -> AsyncIterator[tuple[Any, SessionIndex]]:
    """A store at ``url`` holding ``count`` indexed sessions, and its index; both closed
    afterwards."""
    store = connect(url)
    try:
        index = await _indexed(store, count)
        try:
            yield store, index
        finally:
            index.close()
    finally:
        await store.aclose()


def test_a_single_server_reads_directly_and_others_through_the_client(redis_url: str) -> None:
    assert isinstance(direct_calls(connect(redis_url)), DirectCalls)
    embedded = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    assert direct_calls(embedded) is None


async def test_pages_read_directly_are_the_pages_and_survive_a_cut(redis_url: str) -> None:
    async with _indexed_store(redis_url, 5) as (_, index):
        first = await index.page("t", ACP_LISTING, None, 3)
        assert [r["sessionId"] for r in first.sessions()] == ["sess_0004", "sess_0003", "sess_0002"]
        assert first.has_more
        # The connections are cut: the next page comes through a connection opened again.
        await _cut_every_connection(redis_url)
        for _ in range(3):
            again = await index.page("t", ACP_LISTING, None, 3)
            assert again == first


async def _strip_infos(store: Any, listing: str) -> None:
    """Rewrite ``listing``'s members as bare positions, as they were stored before they
    carried their SessionInfo."""
    key = TenantKeys("t").index(listing)
    members = await store.zrange(key, 0, -1)
    await store.delete(key)
    await store.zadd(key, {m.partition("\x01")[0]: 0 for m in members})


async def test_members_stored_before_they_carried_their_info_are_read_from_the_rows(
    redis_url: str,
) -> None:
    async with _indexed_store(redis_url, 5) as (store, index):
        expected = [await index.page("t", ACP_LISTING, None, 3)]
        expected.append(await index.page("t", ACP_LISTING, expected[0].last, 3))
        await _strip_infos(store, ACP_LISTING)
        bare = [await index.page("t", ACP_LISTING, None, 3)]
        bare.append(await index.page("t", ACP_LISTING, bare[0].last, 3))
        assert bare == expected
        # Projecting a session again replaces its bare member with a full one.
        await index.project(dataclasses.replace(_snapshot(3), seq=2, title="renamed"))
        assert await store.zcard(TenantKeys("t").index(ACP_LISTING)) == 5
        renamed = await index.page("t", ACP_LISTING, None, 3)
        assert [r.get("title") for r in renamed.sessions()] == [None, "renamed", None]


async def test_a_bare_member_whose_row_is_gone_is_left_out_in_either_row_format(
    redis_url: str,
) -> None:
    async with _indexed_store(redis_url, 4) as (store, index):
        await _strip_infos(store, ACP_LISTING)
        rows = TenantKeys("t").rows
        await store.hdel(rows, "sess_0002")
        page = await index.page("t", ACP_LISTING, None, 3)
        assert [r["sessionId"] for r in page.sessions()] == ["sess_0003", "sess_0001"]
        assert page.has_more and page.last is not None and page.last.endswith(":sess_0001")
        # A row in the earlier one-object format: rendered the same.
        old = json.dumps(decode_row(await store.hget(rows, "sess_0003")))
        await store.hset(rows, "sess_0003", old)
        assert (await index.page("t", ACP_LISTING, None, 3)).sessions() == page.sessions()


async def test_a_page_read_cancelled_half_way_leaves_the_next_reads_right(redis_url: str) -> None:
    async with _indexed_store(redis_url, 40) as (_, index):
        expected = await index.page("t", ACP_LISTING, None, 30)
        direct = index._direct
        opened = direct._open() if direct is not None else None
        assert direct is not None and opened is not None
        transport = opened._transport
        assert transport is not None
        # Cancelled before it is sent, while its reply waits unread, and once it is done.
        for moment in ("before", "in flight", "after"):
            if moment == "in flight":
                transport.pause_reading()
            task = asyncio.ensure_future(index.page("t", ACP_LISTING, None, 30))
            if moment == "in flight":
                await wait_for(
                    lambda: bool((opened := direct._open()) and opened._waiting),
                    what="the read to be sent",
                )
            elif moment == "after":
                await task
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            transport.resume_reading()
            assert await index.page("t", ACP_LISTING, None, 30) == expected
            assert await index.page("t", ACP_LISTING, expected.last, 5) != expected


async def test_overlapping_page_reads_each_get_their_own_page(redis_url: str) -> None:
    async with _indexed_store(redis_url, 60) as (_, index):
        positions = [None] + [(await index.page("t", ACP_LISTING, None, k)).last for k in (1, 7)]
        expected = [await index.page("t", ACP_LISTING, after, 5) for after in positions]
        pages = await asyncio.gather(
            *(index.page("t", ACP_LISTING, after, 5) for after in positions * 20)
        )
        assert pages == expected * 20


def test_a_server_with_a_password_and_a_database_is_read_with_both() -> None:
    async def check(url: str) -> None:
        on_db3 = url.replace("redis://", "redis://:s3cret@").removesuffix("/0") + "/3"
        async with _indexed_store(on_db3, 5) as (_, index):
            page = await index.page("t", ACP_LISTING, None, 3)
            assert [r["sessionId"] for r in page.sessions()] == [
                "sess_0004",
                "sess_0003",
                "sess_0002",
            ]
            opened = index._direct._open() if index._direct is not None else None
            assert opened is not None and not opened.lost  # read on the own connections
        wrong = direct_calls(connect(url.replace("redis://", "redis://:wrong@")))
        assert wrong is not None
        with pytest.raises(RedisConnectionError, match="invalid username-password"):
            await wrong.call("PING")

    with password_server("s3cret") as url:
        asyncio.run(check(url))


async def test_a_log_read_directly_gives_the_client_s_events_and_survives_a_cut(
    redis_url: str,
) -> None:
    store: Any = connect(redis_url)
    plain = _redis_py(redis_url)
    direct, client = SessionLog(store), SessionLog(plain)
    try:
        await direct.create("t", "sess_0001", {"type": EventType.CREATED, "cwd": "/w"})
        for i in range(40):
            text = f"chunk {i} é \u2028"
            update = {"sessionUpdate": "agent_message_chunk", "content": {"text": text}}
            await direct.append("t", "sess_0001", {"type": EventType.UPDATE, "update": update})
        ranges = [(0, None, None), (5, None, None), (5, 20, None), (3, None, 4)]
        for after, until, count in ranges:
            assert await direct.read(
                "t", "sess_0001", after=after, until=until, count=count
            ) == await client.read("t", "sess_0001", after=after, until=until, count=count)
        assert (
            direct.reader.calls.direct is not None
            and direct.reader.calls.direct._open() is not None
        )
        # An entry whose fields are in another order reads the same.
        key = SessionKeys("t", "sess_0001").log
        await store.xadd(key, {"ev": '{"type":"update","update":{}}', "ts": "7"}, id="42-0")
        (odd,) = await direct.read("t", "sess_0001", after=41)
        assert (odd.seq, odd.ts, odd.body) == (42, 7, {"type": "update", "update": {}})
        with pytest.raises(SessionMissing):
            await direct.read("t", "sess_0002")
        # The connections are cut: the next read comes through a connection opened again.
        await _cut_every_connection(redis_url)
        for _ in range(3):
            assert len(await direct.read("t", "sess_0001")) == 42
    finally:
        direct.close()
        await plain.aclose()
        await store.aclose()


async def test_a_resume_reads_snapshot_and_lease_alike_on_either_path_and_after_a_cut(
    redis_url: str,
) -> None:
    """``SessionLog.snapshot_and_holder`` (what ``session/resume`` reads, on the bare
    connection in one write) gives what the client's path gives, and recovers from a cut."""
    from broker.store.keys import SessionKeys
    from broker.store.log import SessionLog, SessionMissing

    store: Any = connect(redis_url)
    log = SessionLog(store)
    embedded = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    on_client = SessionLog(embedded)
    try:
        for target in (store, embedded):
            keys = SessionKeys("t", "sess_0001")
            await target.hset(
                keys.snapshot,
                mapping={"tenant": "t", "sid": "sess_0001", "epoch": "e", "seq": 7, "created": 1},
            )
            await target.hset(keys.meta, "k", '"v"')
        await store.set(SessionKeys("t", "sess_0001").lease, "host-a")
        direct = await log.snapshot_and_holder("t", "sess_0001")
        assert log.reader.calls.direct is not None and log.reader.calls.direct._open() is not None
        assert direct[1] == "host-a" and direct[0] == await log.snapshot("t", "sess_0001")
        assert direct[0].meta == {"k": "v"} and direct[0].seq == 7
        assert await on_client.snapshot_and_holder("t", "sess_0001") == (direct[0], None)
        with pytest.raises(SessionMissing):
            await log.snapshot_and_holder("t", "sess_0002")
        await _cut_every_connection(redis_url)
        for _ in range(3):
            assert await log.snapshot_and_holder("t", "sess_0001") == direct
    finally:
        log.close()
        await store.aclose()


async def _calls_of(store: Any, command: str) -> int:
    stats = await store.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_alike_shared_reads_of_one_step_are_read_once_and_each_caller_answered(
    redis_url: str,
) -> None:
    """Reads asked in one step go out together; ``shared`` ones that are the same command
    are read once for all their callers, the others each time."""
    store = connect(redis_url)
    direct = direct_calls(store)
    assert direct is not None
    try:
        await commands(store).hset("h", mapping={"a": "1"})
        await commands(store).set("s", "x")
        await direct.call("PING")  # connected
        before = await _calls_of(store, "hgetall")
        read = (("HGETALL", "h"), ("GET", "s"))
        replies = await asyncio.gather(
            *(direct.calls(*read, shared=True) for _ in range(5)),
            direct.calls(("HGETALL", "h"), shared=True),  # another command: read on its own
            direct.calls(*read),  # not shared: read again
        )
        assert replies == [[["a", "1"], "x"]] * 5 + [[["a", "1"]], [["a", "1"], "x"]]
        assert await _calls_of(store, "hgetall") - before == 3
        # Asked again in a later step: read again, and the shared reply is not kept.
        await commands(store).set("s", "y")
        assert await direct.calls(*read, shared=True) == [["a", "1"], "y"]
    finally:
        direct.close()
        await store.aclose()


async def test_a_shared_read_whose_caller_gives_up_still_answers_the_others(
    redis_url: str,
) -> None:
    store = connect(redis_url)
    direct = direct_calls(store)
    assert direct is not None
    try:
        await commands(store).set("s", "x")
        await direct.call("PING")
        connection = direct._open()
        assert connection is not None and connection._transport is not None
        connection._transport.pause_reading()
        first, second = (
            asyncio.ensure_future(direct.calls(("GET", "s"), shared=True)) for _ in "ab"
        )
        await wait_for(lambda: connection._waiting and not connection._out, what="the read sent")
        first.cancel()
        connection._transport.resume_reading()
        assert await second == ["x"]
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await direct.calls(("GET", "s"), shared=True) == ["x"]
    finally:
        direct.close()
        await store.aclose()


async def test_calls_asked_before_a_cut_fail_and_the_next_ones_reconnect(redis_url: str) -> None:
    store = connect(redis_url)
    direct = direct_calls(store)
    assert direct is not None
    try:
        await direct.call("PING")
        connection = direct._open()
        assert connection is not None
        waiting = [asyncio.ensure_future(direct.calls(("GET", "s"), shared=True)) for _ in "ab"]
        connection.close()  # before the step's write
        for call in waiting:
            with pytest.raises(RedisConnectionError):
                await call
        assert await direct.calls(("GET", "s"), shared=True) == [None]
    finally:
        direct.close()
        await store.aclose()


async def test_a_call_written_once_reads_the_same_on_every_path(redis_url: str) -> None:
    """``StoreCalls``: the own client's connections, redis-py's client of the same server
    and the embedded store give one shape of reply (RESP's) to the same commands."""
    from broker.store.direct import store_calls

    server: Any = connect(redis_url)
    plain: Any = _redis_py(redis_url)
    embedded: Any = connect(None)
    paths = [
        (server, store_calls(server)),
        (plain, store_calls(plain)),
        (embedded, store_calls(embedded)),
    ]
    commands = [
        ("HGETALL", "{s}:h"),
        ("HGETALL", "{s}:none"),
        ("HMGET", "{s}:h", "a", "z"),
        ("XRANGE", "{s}:x", "-", "+"),
        ("XRANGE", "{s}:x", "(1-0", "+", "COUNT", 1),
        ("GET", "{s}:none"),
        ("ZRANGE", "{s}:z", 0, -1),
    ]
    try:
        replies = []
        for target, calls in paths:
            await target.delete("{s}:h", "{s}:x", "{s}:z")
            await target.hset("{s}:h", mapping={"a": "1", "b": "é"})
            await target.xadd("{s}:x", {"ts": "5", "ev": "{}"}, id="1-0")
            await target.xadd("{s}:x", {"ev": "{}", "ts": "6"}, id="2-0")
            await target.zadd("{s}:z", {"m1": 1, "m2": 2})
            replies.append(await calls.calls(*commands))
            assert [await calls.call(*c) for c in commands] == replies[-1]
        assert replies[0] == replies[1] == replies[2]
        assert replies[0][0] == ["a", "1", "b", "é"]
        assert replies[0][3] == [["1-0", ["ts", "5", "ev", "{}"]], ["2-0", ["ev", "{}", "ts", "6"]]]
        assert paths[0][1].direct is not None and paths[0][1].direct._open() is not None
        assert paths[1][1].direct is None and paths[2][1].direct is None
    finally:
        for _, calls in paths:
            calls.close()
        await server.aclose()
        await plain.aclose()
        await embedded.aclose()


async def test_a_call_written_once_fails_fast_on_both_paths_while_the_store_is_away(
    redis_url: str,
) -> None:
    """While the store's breaker is open, the bare connection sends nothing and neither
    does the client it falls back to: the call fails at once with ``StoreAway``."""
    from broker.store.breaker import StoreAway, breaker_of
    from broker.store.direct import store_calls

    server: Any = connect(redis_url)
    calls = store_calls(server)
    breaker = breaker_of(server)
    assert breaker is not None and calls.direct is not None
    try:
        assert await calls.call("GET", "k") is None  # the bare connection is open
        breaker.open(RedisConnectionError("test: the store is away"))
        with pytest.raises(StoreAway):
            await calls.call("GET", "k")
        with pytest.raises(StoreAway):
            await calls.calls(("GET", "k"), ("GET", "j"))
        breaker.close()
        assert await calls.calls(("GET", "k")) == [None]
    finally:
        breaker.close()
        calls.close()
        await server.aclose()


async def test_a_call_goes_one_way_a_cut_connection_is_opened_again_never_the_client(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a single server every ``StoreCalls`` call stays on the bare connection: a cut
    one is opened again (the client's reconnecting policy), an error reply fails as the
    client's would, a script the server forgot is loaded there; the client sends none."""
    from redis.exceptions import NoScriptError, ResponseError

    from broker.store.direct import store_calls

    server: Any = connect(redis_url)
    calls = store_calls(server)
    script = server.register_script("return redis.call('GET', KEYS[1])")

    async def through_the_client(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"sent through the client: {args}")

    try:
        await server.set("k", "v")
        monkeypatch.setattr(server, "execute_command", through_the_client)
        monkeypatch.setattr(server, "pipeline", through_the_client)
        assert await calls.call("GET", "k") == "v"
        for cut in (calls.call("GET", "k"), calls.calls(("GET", "k"), ("GET", "j"))):
            opened = calls.direct._open() if calls.direct is not None else None
            assert opened is not None
            opened.close()
            assert await cut in ("v", ["v", None])
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await calls.call("HGET", "k", "f")
        with pytest.raises(NoScriptError):
            await calls.call("EVALSHA", "0" * 40, 0)
        monkeypatch.undo()
        await server.script_flush()
        monkeypatch.setattr(server, "execute_command", through_the_client)
        assert await calls.script(script, ["k"], []) == "v"  # loaded again, bare
    finally:
        monkeypatch.undo()
        calls.close()
        await server.aclose()
