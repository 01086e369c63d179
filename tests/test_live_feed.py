"""The live feed's contract, the same for every topology: the embedded store, one Redis
server, a Redis Cluster and the master of a Sentinel set (see ``broker/store/live.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.store.live import LiveFeed, Message, open_live_feed

TIMEOUT = 15.0

# Two channels of one slot (one node on a cluster: their messages keep their order), and
# one of another slot.
ONE, TWO, ELSEWHERE = "{feed}:one", "{feed}:two", "{other}:three"


@pytest.fixture(params=["embedded", "redis", "cluster", "sentinel"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def feed(store: Any) -> Any:
    live = open_live_feed(store)
    yield live
    await live.aclose()


async def _read(feed: LiveFeed, until: Any, *, failures: int = 0) -> list[Message]:
    """Read (bounded) until ``until(messages so far)`` holds; ``failures``: how many reads
    may raise ConnectionError (a cut connection) meanwhile."""
    got: list[Message] = []
    async with asyncio.timeout(TIMEOUT):
        while not until(got):
            try:
                got += await feed.read_batch()
            except ConnectionError:
                failures -= 1
                if failures < 0:
                    raise
    return got


def _of(kind: str, got: list[Message], channel: str | None = None) -> list[Any]:
    return [
        m["data"] if kind in ("smessage", "pong") else m["channel"]
        for m in got
        if m["type"] == kind and (channel is None or m["channel"] == channel)
    ]


async def _subscribed(feed: LiveFeed, *channels: str, failures: int = 0) -> None:
    await feed.ssubscribe(*channels)
    await _read(feed, lambda got: set(_of("ssubscribe", got)) >= set(channels), failures=failures)


async def test_what_is_published_arrives_in_order(feed: LiveFeed, store: Any) -> None:
    await _subscribed(feed, ONE, TWO)
    texts = [f'{{"n":{n},"text":"é"}}' for n in range(300)]
    async with store.pipeline(transaction=False) as pipe:
        for n, text in enumerate(texts):
            pipe.spublish(ONE if n % 2 else TWO, text)
        await pipe.execute()
    got = await _read(feed, lambda got: len(_of("smessage", got)) >= len(texts))
    assert _of("smessage", got) == texts
    assert _of("smessage", got, ONE) == texts[1::2]


async def test_channels_of_different_slots_are_all_heard(feed: LiveFeed, store: Any) -> None:
    await _subscribed(feed, ONE)
    await _subscribed(feed, ELSEWHERE)
    await store.spublish(ONE, "a")
    await store.spublish(ELSEWHERE, "b")
    got = await _read(feed, lambda got: len(_of("smessage", got)) >= 2)
    assert sorted(_of("smessage", got)) == ["a", "b"]


async def test_a_channel_left_is_not_heard(feed: LiveFeed, store: Any) -> None:
    await _subscribed(feed, ONE, TWO)
    await feed.sunsubscribe(ONE)
    await _read(feed, lambda got: ONE in _of("sunsubscribe", got))
    await store.spublish(ONE, "gone")
    await store.spublish(TWO, "still here")
    got = await _read(feed, lambda got: "still here" in _of("smessage", got))
    assert _of("smessage", got) == ["still here"]


async def test_a_ping_comes_back_after_what_was_published_before(
    feed: LiveFeed, store: Any
) -> None:
    await _subscribed(feed, ONE)
    await store.spublish(ONE, "before")
    if not await feed.ping("probe"):
        pytest.skip("this engine cannot ping (its caller publishes its probes)")
    got = await _read(feed, lambda got: "probe" in _of("pong", got))
    assert _of("smessage", got) == ["before"]
    assert got.index(next(m for m in got if m["type"] == "pong")) > got.index(
        next(m for m in got if m["type"] == "smessage")
    )


async def test_a_cut_connection_is_subscribed_again_with_every_channel(
    feed: LiveFeed, store: Any, store_kind: str, request: pytest.FixtureRequest
) -> None:
    if store_kind == "embedded":
        pytest.skip("the embedded store has no connection to cut")
    await _subscribed(feed, ONE, ELSEWHERE)
    await _cut_pubsub_connections(store_kind, store, request)
    # The feed may report the cut once (a read raises ConnectionError); it subscribes again
    # to both channels, and says so.
    await _read(feed, lambda got: {ONE, ELSEWHERE} <= set(_of("ssubscribe", got)), failures=2)
    await store.spublish(ONE, "after")
    await store.spublish(ELSEWHERE, "after too")
    got = await _read(feed, lambda got: len(_of("smessage", got)) >= 2)
    assert sorted(_of("smessage", got)) == ["after", "after too"]


async def test_a_closed_feed_reads_and_subscribes_no_more(store: Any) -> None:
    feed = open_live_feed(store)
    await _subscribed(feed, ONE)
    await feed.aclose()
    with pytest.raises(ConnectionError):
        await feed.read_batch()
    with pytest.raises(ConnectionError):
        await feed.ssubscribe(TWO)


async def _cut_pubsub_connections(
    store_kind: str, store: Any, request: pytest.FixtureRequest
) -> None:
    """Kill every pub/sub connection on the server(s) the store's feed talks to."""
    if store_kind != "cluster":
        await store.client_kill_filter(_type="pubsub")
        return
    cluster = request.getfixturevalue("redis_cluster_info")
    for port in cluster.masters():
        with cluster.client(port) as node:
            await asyncio.to_thread(node.client_kill_filter, _type="pubsub")
