"""The live feed on one server: the own client's subscribed connection (standalone), or
redis-py's ``PubSub`` read in bulk (the embedded store, TLS, a Sentinel master)."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest
import redis.asyncio as redis

from broker.store.client import commands, connect
from broker.store.live import LiveFeed, Message, open_live_feed
from broker.store.own_feed import OwnSubscriber
from broker.store.subscriber import BulkSubscriber
from tests.support.redis_server import password_server

TIMEOUT = 10.0


async def _read_until(sub: LiveFeed, count: int, kind: str = "smessage") -> list[Message]:
    """Read (bounded) until ``count`` messages of ``kind`` have arrived."""
    got: list[Message] = []
    async with asyncio.timeout(TIMEOUT):
        while len(got) < count:
            got += [m for m in await sub.read_batch() if m["type"] == kind]
    return got


async def _hears_what_is_published(sub: LiveFeed, store: Any) -> None:
    """Subscribe, publish one message, read it; then close the subscriber."""
    try:
        await sub.ssubscribe("{a}:one")
        await _read_until(sub, 1, kind="ssubscribe")
        await store.spublish("{a}:one", "hello")
        assert [m["data"] for m in await _read_until(sub, 1)] == ["hello"]
    finally:
        await sub.aclose()


async def test_a_single_server_gets_its_own_reader_and_the_others_the_bulk_reader(
    redis_url: str,
) -> None:
    store = connect(redis_url)
    plain = redis.Redis.from_url(redis_url, decode_responses=True)  # as TLS, or Sentinel
    embedded = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    try:
        assert isinstance(open_live_feed(store), OwnSubscriber)
        assert isinstance(open_live_feed(plain), BulkSubscriber)
        assert isinstance(open_live_feed(embedded), BulkSubscriber)
    finally:
        await store.aclose()
        await plain.aclose()
        await embedded.aclose()


async def test_messages_arrive_in_order_with_their_confirmations(redis_url: str) -> None:
    store = connect(redis_url)
    sub = open_live_feed(store)
    try:
        await sub.ssubscribe("{a}:one", "{b}:two")
        confirmed = await _read_until(sub, 2, kind="ssubscribe")
        assert {m["channel"] for m in confirmed} == {"{a}:one", "{b}:two"}
        async with commands(store).pipeline(transaction=False) as pipe:
            for i in range(500):
                pipe.spublish("{a}:one" if i % 2 else "{b}:two", f'{{"n":{i},"text":"é"}}')
            await pipe.execute()
        batches: list[int] = []
        got: list[Message] = []
        async with asyncio.timeout(TIMEOUT):
            while len(got) < 500:
                batch = [m for m in await sub.read_batch() if m["type"] == "smessage"]
                batches.append(len(batch))
                got += batch
        assert max(batches) > 1  # read in bulk: what the connection held, in one batch
        assert [m["data"] for m in got] == [f'{{"n":{i},"text":"é"}}' for i in range(500)]
        assert {m["channel"] for m in got[1::2]} == {"{a}:one"}

        await sub.sunsubscribe("{a}:one")
        await _read_until(sub, 1, kind="sunsubscribe")
        await commands(store).spublish("{a}:one", "gone")
        await commands(store).spublish("{b}:two", "still here")
        assert [m["data"] for m in await _read_until(sub, 1)] == ["still here"]
    finally:
        await sub.aclose()
        await store.aclose()


async def test_a_dropped_connection_is_reported_then_reopened_with_every_channel(
    redis_url: str,
) -> None:
    store: Any = connect(redis_url)
    sub = open_live_feed(store)
    try:
        await sub.ssubscribe("{a}:one", "{b}:two")
        await _read_until(sub, 2, kind="ssubscribe")
        await store.client_kill_filter(_type="pubsub")
        with pytest.raises(ConnectionError):
            async with asyncio.timeout(TIMEOUT):
                while True:
                    await sub.read_batch()
        # The next read reconnects and subscribes again to both channels.
        assert len(await _read_until(sub, 2, kind="ssubscribe")) == 2
        await store.spublish("{b}:two", "after")
        assert [m["data"] for m in await _read_until(sub, 1)] == ["after"]
    finally:
        await sub.aclose()
        await store.aclose()


async def test_a_closed_subscriber_reads_nothing(redis_url: str) -> None:
    sub = open_live_feed(connect(redis_url))
    await sub.ssubscribe("{a}:one")
    await sub.aclose()
    with pytest.raises(ConnectionError):
        await sub.read_batch()


def test_a_server_with_a_password_takes_the_password_and_refuses_a_wrong_one() -> None:
    async def check(url: str) -> None:
        store = connect(url.replace("redis://", "redis://:s3cret@"))
        await _hears_what_is_published(open_live_feed(store), store)
        await store.aclose()
        wrong = open_live_feed(connect(url.replace("redis://", "redis://:wrong@")))
        with pytest.raises(ConnectionError, match=r"WRONGPASS|invalid username-password"):
            await wrong.ssubscribe("{a}:one")
        await wrong.aclose()

    with password_server("s3cret") as url:
        asyncio.run(check(url))


async def test_the_embedded_store_hears_what_is_published_and_answers_a_ping() -> None:
    embedded: Any = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    sub = open_live_feed(embedded)
    await sub.ssubscribe("{a}:one")
    await _read_until(sub, 1, kind="ssubscribe")
    assert await sub.ping("probe")
    assert [m["data"] for m in await _read_until(sub, 1, kind="pong")] == ["probe"]
    await _hears_what_is_published(sub, embedded)
    await embedded.aclose()


async def test_a_ping_is_answered_after_the_messages_before_it(redis_url: str) -> None:
    store = connect(redis_url)
    sub = open_live_feed(store)
    try:
        await sub.ssubscribe("{a}:one")
        await _read_until(sub, 1, kind="ssubscribe")
        await commands(store).spublish("{a}:one", "first")
        assert await sub.ping("probe")
        got: list[Message] = []
        async with asyncio.timeout(TIMEOUT):
            while not any(m["type"] == "pong" for m in got):
                got += await sub.read_batch()
        assert [(m["type"], m["data"]) for m in got] == [("smessage", "first"), ("pong", "probe")]
    finally:
        await sub.aclose()
        await store.aclose()


async def test_an_unreachable_server_is_a_connection_error() -> None:
    from tests.support.redis_server import free_port

    sub = open_live_feed(redis.Redis(port=free_port()))
    with pytest.raises(ConnectionError):
        await sub.ssubscribe("{a}:one")
    await sub.aclose()
