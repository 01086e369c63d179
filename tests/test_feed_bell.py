"""What an idle broker costs a Redis Cluster, piece by piece, without a cluster: the change
feeds' bells (broker/store/feed_bell.py), the pauses of a cluster's feed reads
(broker/store/groups.py: the store is the embedded one, the doorbell a script), the cluster
probe of the breaker (broker/store/breaker.py: the nodes are scripts)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.store import feed_bell
from broker.store.client import commands, connect
from broker.store.feed_bell import AWAKE, MOST_PAUSE, SAFETY, FeedBells
from broker.store.groups import GroupReads
from broker.store.keys import feed_bell as bell_channel


class _Pipe:
    def __init__(self, store: _Recording) -> None:
        self.store = store

    def spublish(self, channel: str, message: str) -> None:
        self.store.published.append(channel)

    async def execute(self) -> list[int]:
        if self.store.failing:
            raise ConnectionError("away")
        return [0]


class _Recording:
    def __init__(self) -> None:
        self.published: list[str] = []
        self.failing = False

    @contextlib.asynccontextmanager
    async def pipeline(self, transaction: bool = False) -> AsyncIterator[_Pipe]:
        yield _Pipe(self)


async def test_a_feed_is_rung_once_a_second_at_most_and_again_after_a_failed_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _Recording()
    bells = FeedBells(store)  # type: ignore[arg-type]  # a pipeline is all it uses
    await bells.ring(["f1", "f2", "f1"])
    await bells.ring(["f1"])
    assert store.published == [bell_channel("f1"), bell_channel("f2")]
    monkeypatch.setattr(feed_bell, "RING_EVERY", 0.0)
    store.failing = True
    await bells.ring(["f1"])  # lost: only logged
    store.failing, store.published = False, []
    monkeypatch.setattr(feed_bell, "RING_EVERY", 3600.0)
    await bells.ring(["f1", "f2"])
    assert store.published == [bell_channel("f1")]  # f1's failed ring did not count


class _Bell:
    """A doorbell that answers at once: ``rings`` says which waits a bell ends."""

    def __init__(self, rings: list[bool]) -> None:
        self.listening = True
        self.rings = rings
        self.waits: list[float] = []
        self.rung: set[str] | None = None  # None: poll every stream

    def start(self) -> None:
        pass

    def take(self) -> set[str] | None:
        rung, self.rung = self.rung, set()
        return rung

    async def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return self.rings.pop(0) if self.rings else False

    async def aclose(self) -> None:
        pass


async def _reads(bell: _Bell, streams: tuple[str, ...] = ("s1",)) -> GroupReads:
    store = connect(None)
    for stream in streams:
        await commands(store).xgroup_create(stream, "g", id="0", mkstream=True)
    reads = GroupReads(store, "g", "c", list(streams), batch=10, block_ms=1000)
    reads._bell = bell  # type: ignore[assignment]  # the cluster's way, on any store
    return reads


async def test_empty_polls_pause_longer_and_longer_then_wait_for_a_bell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    bell = _Bell([])
    reads = await _reads(bell)
    monkeypatch.setattr(reads, "_now", lambda: clock[0])
    await reads.redis.xadd("s1", {"n": "1"})
    assert await reads.read(False)  # found: awake
    assert reads.caught_up is False
    for _ in range(8):
        assert await reads.read(False) == []
        clock[0] += bell.waits[-1] if bell.waits else 0.0
    assert reads.caught_up is True
    doubling = [0.05, 0.1, 0.2, 0.4, 0.8, MOST_PAUSE]
    assert bell.waits[: len(doubling)] == pytest.approx(doubling)
    assert sum(bell.waits[: len(doubling)]) >= AWAKE  # asleep only once AWAKE has passed
    assert bell.waits[-1] == SAFETY
    bell.rings = [True]
    assert await reads.read(False) == []  # a bell: awake again, from the shortest pause
    assert await reads.read(False) == []
    assert bell.waits[-1] == pytest.approx(reads.poll_interval)


async def test_a_reader_that_cannot_hear_the_bells_polls_every_second_at_most() -> None:
    bell = _Bell([])
    bell.listening = False
    reads = await _reads(bell)
    for _ in range(10):
        assert await reads.read(False) == []
    assert max(bell.waits) == MOST_PAUSE
    assert SAFETY not in bell.waits


async def test_a_poll_reads_the_hot_streams_and_every_stream_now_and_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hot: rung, or found with entries, within AWAKE seconds; every stream at first, when
    the bells may have gone unheard, and every SAFETY seconds."""
    clock = [1000.0]
    bell = _Bell([])
    reads = await _reads(bell, ("s1", "s2", "s3"))
    monkeypatch.setattr(reads, "_now", lambda: clock[0])
    redis = reads.redis
    assert await reads.read(False) == []  # the first poll: every stream
    await redis.xadd("s1", {"n": "1"})
    await redis.xadd("s2", {"n": "1"})
    assert await reads.read(False) == []  # no bell: neither is hot
    bell.rung = {"s2"}
    assert [s for s, _ in await reads.read(False)] == ["s2"]
    await redis.xadd("s2", {"n": "2"})  # within a second of its bell: rings none
    clock[0] += AWAKE - 0.1
    assert [s for s, _ in await reads.read(False)] == ["s2"]  # hot still (found just now)
    clock[0] += SAFETY
    assert [s for s, _ in await reads.read(False)] == ["s1"]  # every one, now and then
    await redis.xadd("s3", {"n": "1"})
    bell.rung = None  # a new subscription: what rang meanwhile is unknown
    assert [s for s, _ in await reads.read(False)] == ["s3"]


class _Node:
    """A cluster node whose ``PING`` answers when its test says so."""

    def __init__(self, name: str, answers: bool) -> None:
        self.name = name
        self.answers = answers
        self.sent = 0
        self.cancelled = 0

    async def execute_command(self, *args: Any) -> str:
        self.sent += 1
        if self.answers:
            return "PONG"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "never"


class _Cluster:
    def __init__(self, nodes: list[_Node]) -> None:
        self.nodes = nodes

    def get_primaries(self) -> list[_Node]:
        return self.nodes


async def test_the_cluster_probe_leaves_a_slow_masters_ping_to_finish() -> None:
    """A ping cancelled in flight costs its connection (redis-py drops it): the probe's
    rounds, answered by the first master, leave the others' pings out, and send a node no
    second ping while its first is out; only a round nobody answered cuts them."""
    from broker.store.breaker import _any_master

    quick, slow = _Node("a", True), _Node("b", False)
    cluster: Any = _Cluster([quick, slow])
    in_flight: dict[str, asyncio.Future[Any]] = {}
    for _ in range(3):
        await _any_master(cluster, in_flight)
        await asyncio.sleep(0)
    assert (quick.sent, slow.sent, slow.cancelled) == (3, 1, 0)
    quick.answers = False
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(_any_master(cluster, in_flight), 0.1)
    await asyncio.sleep(0)
    assert slow.cancelled == 1 and quick.cancelled == 1
