"""The fronts' list page cache (``broker/front/pages.py``) and the index's announcements.

Real servers throughout: a redis-server of the test's own, the embedded store and a real
3-master Redis Cluster. Every wait is bounded and waits for a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.front.node import FrontNode
from broker.front.pages import (
    HOLD_GAP,
    PROBE_MARK,
    READS_AHEAD,
    REFRESH_BUDGET,
    IndexWatch,
    PageCache,
)
from broker.protocol.jsonrpc import Request
from broker.serve import Broker
from broker.store.archive import DirectoryArchive
from broker.store.breaker import StoreBreaker
from broker.store.client import connect
from broker.store.events import EventType
from broker.store.index import SessionIndex
from broker.store.keys import INDEX_CHANNEL
from broker.store.log import SessionLog, new_session_id
from broker.store.query import SessionQuery
from broker.store.rebuild import rebuild_index
from workers.projector.archiving import Archiver
from workers.projector.worker import Projector

from .conftest import make_settings
from .support.client import wait_for
from .support.nodes import holding, running_front
from .support.redis_server import restartable_redis

PROBE = 0.5
"""The probe interval of the tests' watches (seconds)."""


@pytest.fixture(params=["redis", "embedded", "cluster", "sentinel"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _front(store: Any, **overrides: Any) -> contextlib.AbstractAsyncContextManager[FrontNode]:
    """A second front (no roles beside it) on ``store``, its cache subscribed."""
    node = FrontNode(make_settings(**overrides), redis=store)
    node.index_watch.probe_interval = PROBE
    return running_front(node)


def _reads(node: FrontNode) -> list[str]:
    """Counts the front's page reads from Redis (one entry per read)."""
    reads: list[str] = []
    page = node.index.page

    async def counted(tenant: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(tenant)
        return await page(tenant, *args, **kwargs)

    node.index.page = counted  # type: ignore[method-assign]
    return reads


async def _list(node: FrontNode, tenant: str = "default", **params: Any) -> dict[str, Any]:
    conn = types.SimpleNamespace(tenant=tenant)
    reply = await node.methods.session_list(conn, Request("session/list", params, 1))  # type: ignore[arg-type]
    return dict(json.loads(reply.text))


async def _created(log: SessionLog, tenant: str, title: str | None = None) -> str:
    session_id = new_session_id()
    await log.create(tenant, session_id, {"type": EventType.CREATED, "cwd": "/w", "agent": "demo"})
    if title is not None:
        await log.append(tenant, session_id, _title(title))
    return session_id


def _title(title: str) -> dict[str, Any]:
    return {
        "type": EventType.UPDATE,
        "update": {"sessionUpdate": "session_info_update", "title": title},
    }


async def _project(node: FrontNode, tenant: str, session_id: str) -> None:
    await node.index.project(await node.log.snapshot(tenant, session_id))


def _titles(reply: dict[str, Any]) -> list[str | None]:
    return [s.get("title") for s in reply["sessions"]]


async def _listed_and_kept(node: FrontNode, titles: list[str | None]) -> bool:
    """List the default tenant (it must show ``titles``); is that page now in the cache?"""
    assert _titles(await _list(node)) == titles
    return node.pages is not None and len(node.pages) == 1


# -- the cache alone ----------------------------------------------------------------------


async def test_a_read_in_flight_across_an_invalidation_or_a_reset_is_not_kept() -> None:
    cache = PageCache(2)
    key = ("a", "acp", None, None, 50)
    assert cache.get(key) is None and cache.begin() is None  # not subscribed: bypassed
    cache.up()
    token = cache.begin()
    cache.invalidate("a")  # arrived while the read was in flight
    cache.put(key, token, "old")
    assert cache.get(key) is None
    token = cache.begin()
    cache.invalidate("b")  # another tenant's change does not matter
    cache.put(key, token, "fresh")
    assert cache.get(key) == "fresh"
    token = cache.begin()
    cache.reset()
    cache.put(("a", "other"), token, "x")
    assert cache.get(("a", "other")) is None and cache.get(key) is None
    cache.put(key, cache.begin(), "p1")
    cache.put(("b", 1), cache.begin(), "p2")
    cache.get(key)  # used last: the other goes first
    cache.put(("c", 1), cache.begin(), "p3")
    assert len(cache) == 2 and cache.get(("b", 1)) is None and cache.get(key) == "p1"
    cache.down()
    assert cache.get(key) is None and cache.begin() is None  # held, not answered (no breaker)
    cache.up()
    assert len(cache) == 0


async def test_held_pages_are_answered_only_while_the_store_is_away_in_that_outage() -> None:
    breaker = StoreBreaker()
    cache = PageCache(4)
    cache.held.breaker = breaker
    key = ("a", 1)
    cache.up()
    cache.put(key, cache.begin(), "p")
    cache.down()
    assert cache.get(key) is None  # the watch lost Redis; the breaker has not opened
    breaker.open(ConnectionError("refused"))
    assert cache.get(key) == "p" and cache.begin() is None  # answered, nothing stored
    cache.invalidate("a")  # this front's own write (it failed fast, but may have landed)
    assert cache.get(key) is None
    cache.up()
    cache.put(key, cache.begin(), "p")
    cache.down()
    assert cache.get(key) == "p"  # the breaker opened before the watch lost Redis
    breaker.close()
    assert cache.get(key) is None  # the store answers: not without a subscription
    breaker.open(ConnectionError("refused"))
    assert cache.get(key) is None  # it answered since they were held: maybe stale
    breaker.close()
    cache.up()
    cache.put(key, cache.begin(), "p")
    cache.down()
    cache.held._at -= HOLD_GAP + 1  # held long before this outage began
    breaker.open(ConnectionError("refused"))
    assert cache.get(key) is None


async def test_a_page_read_ahead_is_kept_by_the_rules_of_any_read() -> None:
    cache = PageCache(8)
    cache.up()
    release = asyncio.Event()
    asked: list[str] = []

    def reading(page: str) -> Any:
        async def read() -> tuple[str, Any]:
            await release.wait()
            return page, lambda: asked.append(page)

        return read

    cache.read_ahead(("a", 1), reading("one"))
    cache.read_ahead(("a", 1), reading("again"))  # being read: not read twice
    cache.read_ahead(("a", 2), reading("crossed"))
    cache.invalidate("a")  # the tenant changed while they were read: ("a", 2) is not kept
    token = cache.begin()
    cache.put(("a", 1), token, "asked meanwhile")  # a client's read of it, since
    release.set()
    await wait_for(lambda: not cache._ahead)
    assert cache.get(("a", 2)) is None
    assert cache.get(("a", 1)) == "asked meanwhile"
    cache.read_ahead(("b", 1), reading("two"))
    await wait_for(lambda: not cache._ahead)
    assert cache.get(("b", 1)) == "two"  # first asked for: what comes with it is done, once
    await wait_for(lambda: asked == ["two"])
    assert cache.get(("b", 1)) == "two"
    assert not cache._when_asked  # done once: nothing more to do on a later ask
    release.clear()
    for n in range(READS_AHEAD + 2):  # at most READS_AHEAD at once
        cache.read_ahead(("c", n), reading(str(n)))
    assert len(cache._ahead) == READS_AHEAD
    cache.read_ahead(("b", 1), reading("kept already"))
    assert len(cache._ahead) == READS_AHEAD
    await cache.stop_refreshing()  # cancelled, and so not kept
    assert not cache._ahead and cache.get(("c", 0)) is None


async def test_an_ask_waits_for_a_read_ahead_until_it_lands_or_for_its_bound() -> None:
    cache = PageCache(8)
    cache.up()
    release = asyncio.Event()

    async def read() -> tuple[str, None]:
        await release.wait()
        return "page", None

    assert cache.landed(("a", 1), 5.0) is None  # nothing read ahead: nothing to wait for
    cache.read_ahead(("a", 1), read)
    assert cache.reading_ahead(("a", 1))
    first, second = cache.landed(("a", 1), 5.0), cache.landed(("a", 1), 5.0)
    assert first is not None and second is not None
    first.cancel()  # one ask gone (cancelled, its connection closed): the read goes on
    release.set()
    await asyncio.wait_for(second, 5.0)
    assert cache.get(("a", 1)) == "page"  # read to its end and kept
    release.clear()
    cache.read_ahead(("a", 2), read)
    bounded = cache.landed(("a", 2), 0.05)
    assert bounded is not None
    await asyncio.wait_for(bounded, 5.0)  # a slow read: the ask is let go at its bound
    assert cache.reading_ahead(("a", 2)) and cache.get(("a", 2)) is None
    await cache.stop_refreshing()


async def test_a_failed_read_ahead_is_logged_and_read_when_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = PageCache(8)
    cache.up()

    async def failing() -> tuple[str, None]:
        raise ConnectionError("the store is away")

    with caplog.at_level("WARNING", logger="broker.front.pages"):
        cache.read_ahead(("a", 1), failing)
        await wait_for(lambda: not cache._ahead)
    assert cache.get(("a", 1)) is None
    assert "the store is away" in caplog.text


async def test_a_list_read_page_by_page_reads_only_its_first_page_on_the_ask(
    store: Any,
) -> None:
    # Without refreshes: a dropped first page read again in the background would land
    # before or after the ask below, as the machine's load has it.
    async with _front(store, list_page_size=2, list_cache_refresh=False) as node:
        pages = node.pages
        assert pages is not None
        await wait_for(lambda: pages.live)
        created = [await _created(node.log, "default", f"s{n}") for n in range(7)]
        for session_id in created:
            await _project(node, "default", session_id)
        await _heard_until_now(node)
        seen: list[str | None] = []
        misses: list[int] = []  # how many sessions had been seen at each miss
        missed = pages.missed

        def counted() -> None:
            misses.append(len(seen))
            missed()

        pages.missed = counted  # type: ignore[method-assign]
        params: dict[str, Any] = {}
        for kept in range(2, 6):
            reply = await _list(node, **params)
            seen += _titles(reply)
            if "nextCursor" not in reply:
                break
            params = {"cursor": reply["nextCursor"]}
            await wait_for(holding(pages, kept))  # the next one, read ahead
        assert sorted(map(str, seen)) == [f"s{n}" for n in range(7)]  # each once, ties any way
        assert misses == [0]  # the first page only
        # a change drops them all: the next ask of the first page reads it, and reads ahead
        await node.log.append("default", created[0], _title("renamed"))
        await _project(node, "default", created[0])
        await wait_for(holding(pages, 0))
        await _heard_until_now(node)  # the announcement of it too: it would drop the next read
        assert _titles(await _list(node))[0] == "renamed"
        await wait_for(holding(pages, 2))
        assert len(misses) == 2


async def test_a_dropped_page_is_read_again_within_its_budget_and_coalesced() -> None:
    cache = PageCache(8)
    cache.refreshing = True
    cache.up()
    reads: list[asyncio.Future[str]] = []

    async def reload() -> str:
        reads.append(asyncio.get_running_loop().create_future())
        return await reads[-1]

    key, idle = ("a", "acp", None, None, 50), ("a", "acp", "/w", None, 50)
    cache.put(key, cache.begin(), "v1", reload)
    cache.put(idle, cache.begin(), "w1", reload)
    cache._reloads[idle].left = 0  # read again as often as it may be, unasked: dropped only
    cache.put(("b", 1), cache.begin(), "other")  # no way to read it again: dropped only
    cache.invalidate("a")
    await wait_for(lambda: len(reads) == 1, what="one page read again")
    assert cache.get(key) is None  # dropped at once: not served while it is read
    cache.invalidate("a")  # another change while the read is under way
    reads[0].set_result("v2")  # read before that change: not kept ...
    await wait_for(lambda: len(reads) == 2, what="... and read once more")
    assert cache.get(key) is None
    reads[1].set_result("v3")
    await wait_for(lambda: cache._entries.get(key) == "v3", what="the page kept again")
    assert cache.get(idle) is None and len(reads) == 2
    cache.invalidate("b")
    assert cache.get(("b", 1)) is None and not cache._refreshers
    # Refreshed is not asked for: a page nobody asks for again is read again twice in all
    # (REFRESH_BUDGET), then only dropped; an ask gives it its budget back.
    assert cache._reloads[key].left == 1  # spent on the first refresh (the second was owed)
    cache.invalidate("a")
    await wait_for(lambda: len(reads) == 3, what="read again: the budget's last")
    reads[2].set_result("v4")
    await wait_for(lambda: key in cache._entries, what="kept")
    cache.invalidate("a")
    assert key not in cache._entries and len(reads) == 3 and not cache._refreshers
    cache.put(key, cache.begin(), "v5", reload)
    assert cache.hit(key) == "v5" and cache._reloads[key].left == REFRESH_BUDGET
    # A failed read leaves the page dropped; down, nothing is read or kept.
    cache.invalidate("a")
    await wait_for(lambda: len(reads) == 4, what="a fourth read")
    reads[3].set_exception(ConnectionError("away"))
    await wait_for(lambda: not cache._refreshers, what="the refresh to end")
    assert cache.get(key) is None and cache.refresh_failures.failing
    cache.put(key, cache.begin(), "v6", reload)
    cache.down()
    assert cache.get(key) is None and len(reads) == 4
    await cache.stop_refreshing()


async def test_a_polled_page_is_a_hit_again_after_its_tenants_change_and_shows_it(
    store: Any,
) -> None:
    async with _front(store) as node, _front(store) as other:
        assert node.pages is not None
        reads = _reads(node)
        session_id = await _created(node.log, "default", "one")
        await _project(node, "default", session_id)
        await _heard_until_now(node)
        # Asked once the announcements so far were heard: its budget of reads again whole.
        assert _titles(await _list(node)) == ["one"]
        # Another front's change (announced): dropped, read again, the next ask a hit.
        before = len(reads)
        await other.log.append("default", session_id, _title("two"))
        await _project(other, "default", session_id)
        pages = node.pages
        await wait_for(lambda: len(pages) == 1 and len(reads) > before, what="read again")
        read = len(reads)
        assert _titles(await _list(node)) == ["two"]
        assert len(reads) == read  # a hit: nothing read for it
        # The front's own change: seen at once by the next ask, whether the page read
        # again is there yet or not.
        await node.log.append("default", session_id, _title("three"))
        await _project(node, "default", session_id)
        assert _titles(await _list(node)) == ["three"]
        await wait_for(lambda: len(pages) == 1, what="kept again")
        assert _titles(await _list(node)) == ["three"]


async def test_with_refresh_off_a_dropped_page_is_only_dropped(store: Any) -> None:
    async with _front(store, list_cache_refresh=False) as node:
        assert node.pages is not None and not node.pages.refreshing
        session_id = await _created(node.log, "default", "one")
        await _project(node, "default", session_id)
        assert _titles(await _list(node)) == ["one"]
        node.pages.invalidate("default")
        assert len(node.pages) == 0 and not node.pages._refreshers


# -- every writer of the index announces ----------------------------------------------------


async def test_every_writer_of_the_index_announces_its_tenants(store: Any, tmp_path: Path) -> None:
    heard: list[str] = []

    class Recording(PageCache):
        def invalidate(self, tenant: Any) -> None:
            heard.append(tenant)
            super().invalidate(tenant)

    cache = Recording(16)
    watch = IndexWatch(store, cache, probe_interval=PROBE)
    await watch.start()
    told: list[str] = []
    log, index = SessionLog(store), SessionIndex(store, changed=told.append)
    try:
        await wait_for(lambda: cache.live)

        async def announced(tenant: str) -> None:
            await wait_for(lambda: tenant in heard)
            heard.clear()

        # the front's own projection: told at once, and announced
        one = await _created(log, "t-project")
        await index.project(await log.snapshot("t-project", one))
        assert told == ["t-project"]
        await announced("t-project")
        # the projector: a full projection of a batch, then the in-place (touch.lua) path
        projector = Projector(store)
        await projector.ensure_groups()
        two = await _created(log, "t-batch")
        await projector._drain(pending=False)
        await announced("t-batch")
        await log.append(
            "t-batch", two, {"type": EventType.UPDATE, "update": {"sessionUpdate": "plan"}}
        )
        await projector._drain(pending=False)
        await announced("t-batch")
        # removal (a purge), then a rebuild
        await log.append("t-project", one, {"type": EventType.DELETED})
        await Archiver(store, DirectoryArchive(tmp_path)).purge_session("t-project", one)
        await announced("t-project")
        await rebuild_index(store)
        await announced("t-batch")
        projector.index.close()
    finally:
        await watch.stop()
        index.close()


# -- fronts ---------------------------------------------------------------------------------


async def test_a_repeated_page_is_a_hit_and_a_projector_change_reaches_a_second_front(
    store: Any,
) -> None:
    broker = Broker(make_settings(), redis=store)  # a front with a projector beside it
    await broker.start()
    try:
        async with _front(store) as second:
            reads = _reads(second)
            session_id = await _created(broker.log, "default", "first")
            await wait_for(lambda: _has_title(second, "first"))
            await _heard_until_now(second)
            reads.clear()
            for _ in range(5):
                assert _titles(await _list(second)) == ["first"]
            # answered from the cache (one read: the last announcement may have dropped it)
            assert len(reads) <= 1
            await broker.log.append("default", session_id, _title("renamed"))
            await wait_for(lambda: _has_title(second, "renamed"))  # the projector announced it
            assert len(reads) >= 1
            await _heard_until_now(second)
            # REST and MCP's pages too: a hit, then a change shows
            service = second.http.rest.sessions
            query = SessionQuery()
            page = await service._page("default", query)
            assert [row["title"] for row in page.rows] == ["renamed"]
            assert await service._page("default", query) is page
            await broker.log.append("default", session_id, _title("again"))
            await wait_for(
                lambda: _rest_title(service, "again"),
            )
    finally:
        await broker.stop()


async def _heard_until_now(node: FrontNode) -> None:
    """Wait (bounded) until the front has heard every announcement published so far: its
    watch hears a probe published from now on (the channel delivers in order). A page read
    before then can still be dropped by an announcement on its way, such as the projector's
    of a change the page already shows."""
    watch = node.index_watch
    assert watch is not None
    sent = watch._sent  # probe ``sent`` itself may not be published yet: wait for the next
    await wait_for(lambda: watch._heard > sent, 10, "a probe published from now on")


async def _has_title(node: FrontNode, title: str) -> bool:
    return _titles(await _list(node)) == [title]


async def _rest_title(service: Any, title: str) -> bool:
    page = await service._page("default", SessionQuery())
    return [row["title"] for row in page.rows] == [title]


async def test_a_page_read_across_an_invalidation_is_not_cached(store: Any) -> None:
    async with _front(store) as node:
        session_id = await _created(node.log, "default", "before")
        await _project(node, "default", session_id)
        started, release = asyncio.Event(), asyncio.Event()
        page = node.index.page

        async def slow(*args: Any, **kwargs: Any) -> Any:
            result = await page(*args, **kwargs)  # what the index held when the read was made
            started.set()
            await release.wait()
            return result

        node.index.page = slow  # type: ignore[method-assign]
        listing = asyncio.create_task(_list(node))
        await started.wait()
        assert node.pages is not None
        before = node.pages._changed_at.get("default", 0)
        other = SessionIndex(store)  # another writer (a projector), on another process's way
        await node.log.append("default", session_id, _title("after"))
        await other.project(await node.log.snapshot("default", session_id))
        other.close()
        assert node.pages is not None
        pages = node.pages
        await wait_for(lambda: pages._changed_at["default"] > before)
        release.set()
        assert _titles(await listing) == ["before"]  # answered as read
        node.index.page = page  # type: ignore[method-assign]
        assert _titles(await _list(node)) == ["after"]  # but not kept


async def test_a_fronts_own_change_is_dropped_before_its_reply(store: Any) -> None:
    async with _front(store) as node:
        session_id = await _created(node.log, "default", "one")
        await _project(node, "default", session_id)
        assert _titles(await _list(node)) == ["one"]
        await node.log.append("default", session_id, _title("two"))
        await _project(node, "default", session_id)  # as session/set_title does
        assert _titles(await _list(node)) == ["two"]  # no wait: dropped locally at once


async def test_tenants_never_share_a_page(store: Any) -> None:
    async with _front(store) as node:
        for tenant in ("tenant-a", "tenant-b"):
            session_id = await _created(node.log, tenant, f"of {tenant}")
            await _project(node, tenant, session_id)
        for _ in range(2):
            assert _titles(await _list(node, "tenant-a")) == ["of tenant-a"]
            assert _titles(await _list(node, "tenant-b")) == ["of tenant-b"]
            for tenant in ("tenant-a", "tenant-b"):
                page = await node.http.rest.sessions._page(tenant, SessionQuery())
                assert [row["title"] for row in page.rows] == [f"of {tenant}"]


async def test_with_the_cache_off_every_page_is_read(store: Any) -> None:
    async with _front(store, list_cache=False) as node:
        assert node.pages is None and node.index_watch.cache is None  # it tells listeners
        reads = _reads(node)
        session_id = await _created(node.log, "default", "t")
        await _project(node, "default", session_id)
        for _ in range(3):
            assert _titles(await _list(node)) == ["t"]
        assert len(reads) == 3


# -- faults ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _front_on_own_redis(aof: bool, title: str) -> AsyncIterator[tuple[Any, FrontNode, str]]:
    """A redis-server of the test's own (to restart or stall), a front on it, and a session
    titled ``title`` in its index: ``(server, node, session_id)``."""
    with restartable_redis(aof=aof) as server:
        store = connect(server.url, timeout=1.0)
        try:
            async with _front(store) as node:
                assert node.pages is not None
                session_id = await _created(node.log, "default", title)
                await _project(node, "default", session_id)
                yield server, node, session_id
        finally:
            await store.aclose()


@pytest.mark.parametrize("store_kind", ["redis"])
@pytest.mark.parametrize("keep_data", [True, False])
async def test_a_redis_restart_bypasses_the_cache_and_it_comes_back_empty(
    store_kind: str, keep_data: bool
) -> None:
    async with _front_on_own_redis(aof=True, title="kept") as (server, node, _):
        # The projection's own announcement may come back after the first read and drop its
        # page, so list until a page is kept.
        await wait_for(lambda: _listed_and_kept(node, ["kept"]))
        server.kill()
        await wait_for(lambda: node.pages is not None and not node.pages.live)
        assert node.pages is not None and node.pages.begin() is None  # nothing stored
        if not keep_data:
            server.wipe()
        server.start()
        await wait_for(lambda: node.pages is not None and node.pages.live, 20)
        reply = await _list(node)
        assert _titles(reply) == (["kept"] if keep_data else [])  # nothing stale


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_stalled_redis_bypasses_the_cache_until_it_answers(store_kind: str) -> None:
    async with _front_on_own_redis(aof=False, title="s") as (server, node, session_id):
        assert _titles(await _list(node)) == ["s"]
        server.pause()
        try:
            await wait_for(lambda: node.pages is not None and not node.pages.live)
            assert node.pages is not None and node.pages.begin() is None  # nothing stored
        finally:
            server.resume()
        await wait_for(lambda: node.pages is not None and node.pages.live, 20)
        await node.log.append("default", session_id, _title("after the stall"))
        await _project(node, "default", session_id)
        assert _titles(await _list(node)) == ["after the stall"]


@pytest.mark.parametrize("store_kind", ["cluster"])
async def test_a_failover_of_the_channels_master_leaves_no_stale_page(
    store: Any, store_kind: str, redis_cluster_info: Any
) -> None:
    broker = Broker(make_settings(), redis=store)  # a front with a projector beside it
    await broker.start()
    try:
        async with _front(store) as second:
            assert second.pages is not None
            session_id = await _created(broker.log, "default", "before")
            await wait_for(lambda: _has_title(second, "before"))
            master = redis_cluster_info.master_of(INDEX_CHANNEL)
            replica = redis_cluster_info.replica_of(master)
            await asyncio.to_thread(redis_cluster_info.promote, replica)
            await wait_for(lambda: redis_cluster_info.master_of(INDEX_CHANNEL) == replica, 30)
            await broker.log.append("default", session_id, _title("after"))
            await wait_for(lambda: _has_title(second, "after"), 30)
            await wait_for(lambda: second.pages is not None and second.pages.live, 30)
            assert _titles(await _list(second)) == ["after"]
    finally:
        await broker.stop()


async def test_probes_are_pings_on_the_subscription_not_messages_to_every_front(
    store: Any, store_kind: str
) -> None:
    """On one server (standalone, a Sentinel master, the embedded store) a front probes its
    subscription with PING on that connection: its probes reach it alone, not every
    front's subscription (N fronts: N² messages a second). A cluster's (redis-py's
    per-node pub/sub) cannot; its fronts publish their probes."""
    if store_kind == "cluster":
        await store.initialize()  # its pub/sub finds the channel's node in the slot map
    listener = store.pubsub()
    await listener.ssubscribe(INDEX_CHANNEL)
    try:
        async with _front(store) as node:
            watch = node.index_watch
            await wait_for(lambda: watch.live, 10, "the watch subscribed")
            start, channel = watch._heard, watch._channel
            await wait_for(lambda: watch._heard >= start + 3, 10, "three probes heard")
            assert watch.live
            assert watch._channel is channel  # heard, not subscribed again each time
            # What anyone published on the channel before the marker reaches the listener
            # before it (one channel, one order).
            marker = f"{PROBE_MARK}test-marker"
            await store.spublish(INDEX_CHANNEL, marker)
            heard: list[str] = []
            while marker not in heard:
                message = await asyncio.wait_for(_sharded(listener), 10)
                if message is not None and message["type"] == "smessage":
                    heard.append(message["data"])
            probes = [data for data in heard if data != marker]
            if store_kind == "cluster":
                assert probes  # published: the cluster's subscriber does not ping
            else:
                assert probes == []
    finally:
        await listener.aclose()


async def _sharded(listener: Any) -> Any:
    if hasattr(listener, "get_sharded_message"):
        return await listener.get_sharded_message(timeout=1.0)
    return await listener.get_message(timeout=1.0)
