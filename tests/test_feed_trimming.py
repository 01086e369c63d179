"""The change feeds are trimmed behind the projectors' consumer group, never past a notice
that a projector has not acknowledged, and projecting goes on as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.store.events import EventType
from broker.store.index import SessionIndex
from broker.store.keys import SessionKeys
from broker.store.log import SessionLog, new_session_id
from broker.store.streams import trim_floor
from workers.projector.feeds import trim_feed, trim_feeds
from workers.projector.worker import GROUP, Projector

from .support.client import wait_for
from .support.projection import until_consumed

TENANT = "acme"
CHUNK = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}


@pytest.fixture(params=["redis", "embedded", "cluster", "sentinel"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _session_with_events(store: Any, events: int) -> SessionKeys:
    log, session_id = SessionLog(store), new_session_id()
    created = {"type": EventType.CREATED, "cwd": "/work", "agent": "demo", "kind": "combined"}
    await log.create(TENANT, session_id, created)
    body = {"type": EventType.UPDATE, "update": CHUNK}
    for start in range(0, events, 100):
        items = [(TENANT, session_id, body, "")] * min(100, events - start)
        assert not any(isinstance(r, Exception) for r in await log.append_many(items))
    return SessionKeys(TENANT, session_id)


def test_the_floor_is_past_last_delivered_or_at_the_oldest_pending() -> None:
    group = {"name": GROUP.encode(), "last-delivered-id": b"200-0"}
    assert trim_floor([group], {"pending": 0, "min": None}, GROUP) == "200-1"
    assert trim_floor([group], {"pending": 2, "min": b"150-3"}, GROUP) == "150-3"
    assert trim_floor([group], {"pending": 1, "min": b"1000-0"}, GROUP) == "200-1"
    assert trim_floor([{**group, "last-delivered-id": b"0-0"}], {"pending": 0}, GROUP) is None
    assert trim_floor([{"name": b"other", "last-delivered-id": b"9-0"}], {}, GROUP) is None


async def test_a_feed_whose_notices_are_all_acknowledged_is_emptied(store: Any) -> None:
    keys = await _session_with_events(store, 450)
    await store.xgroup_create(keys.feed, GROUP, id="0")
    read = await store.xreadgroup(GROUP, "p", {keys.feed: ">"}, count=1000)
    await store.xack(keys.feed, GROUP, *[entry_id for entry_id, _ in read[0][1]])
    assert await trim_feed(store, keys.feed) == 451
    assert await store.xlen(keys.feed) == 0, "an acknowledged notice stayed"


async def test_at_most_one_node_of_acknowledged_notices_stays(store: Any) -> None:
    """The approximate trim's bound: beside unacknowledged notices, fewer acknowledged ones
    than a stream node holds (``stream-node-max-entries``: 100)."""
    keys = await _session_with_events(store, 650)
    await store.xgroup_create(keys.feed, GROUP, id="0")
    read = await store.xreadgroup(GROUP, "p", {keys.feed: ">"}, count=1000)
    ids = [entry_id for entry_id, _ in read[0][1]]
    await store.xack(keys.feed, GROUP, *ids[:555])
    await trim_feed(store, keys.feed)
    left = [entry_id for entry_id, _ in await store.xrange(keys.feed)]
    assert set(ids[555:]) <= set(left), "an unacknowledged notice was trimmed"
    assert len(left) - len(ids[555:]) < 100


async def test_a_feed_without_the_group_is_kept_whole(store: Any) -> None:
    keys = await _session_with_events(store, 300)
    length = await store.xlen(keys.feed)
    assert await trim_feeds(store) == 0
    assert await store.xlen(keys.feed) == length


async def test_unacknowledged_notices_are_kept(store: Any) -> None:
    keys = await _session_with_events(store, 600)
    await store.xgroup_create(keys.feed, GROUP, id="0")
    read = await store.xreadgroup(GROUP, "p", {keys.feed: ">"}, count=600)
    ids = [entry_id for entry_id, _ in read[0][1]]
    await store.xack(keys.feed, GROUP, *ids[:400])  # the last 200+ stay pending
    assert await trim_feed(store, keys.feed) > 0
    left = [entry_id for entry_id, _ in await store.xrange(keys.feed)]
    assert set(ids[400:]) <= set(left), "a pending notice was trimmed"
    assert len(left) < len(ids)


async def test_the_projector_goes_on_after_a_trim(store: Any) -> None:
    keys = await _session_with_events(store, 500)
    projector = Projector(store)
    task = asyncio.create_task(projector.run())
    try:
        await until_consumed(store, [keys.feed])
        assert await trim_feeds(store) == 501
        assert await store.xlen(keys.feed) == 0
        title = {"sessionUpdate": "session_info_update", "title": "after the trim"}
        await SessionLog(store).append(
            TENANT, keys.session_id, {"type": EventType.UPDATE, "update": title}
        )
        await _until_titled(store, keys, "after the trim")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until_titled(store: Any, keys: SessionKeys, title: str) -> None:
    index = SessionIndex(store)

    async def titled() -> bool:
        row = await index.row(TENANT, keys.session_id)
        return row is not None and row["title"] == title

    await wait_for(titled, 10.0, f"the index to show the title {title!r}")
