"""Reading several streams through one consumer group, acknowledgements included, in as
few round trips as the store's topology allows.

* One Redis server over plain TCP or a Unix socket: the acknowledgements of the previous
  read and the next read go in one write on a connection of its own (:mod:`.direct`), the reply
  parsed by hiredis (redis-py's pipeline, its packing and its reply callbacks were a
  quarter of a projector's samples at the soak). A lost connection is read again on a fresh
  one, as the client would (:func:`~.direct.reconnecting`); any other failure is the
  caller's, as the client's would be.
* Through the client (TLS, a Sentinel master, the embedded store): the acknowledgements and
  one blocking ``XREADGROUP`` of every stream, in one pipeline.
* A Redis Cluster: the streams live in different slots, which one command may not span:
  the acknowledgements go first, then a pipeline polls each stream (no blocking read; the
  client sends each node its share at once). Between polls that found nothing, the pauses
  double, and a reader idle for a while waits for the streams' bells
  (:mod:`.feed_bell`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from .boundary import port
from .client import Store, commands, is_cluster
from .direct import direct_calls, reconnecting
from .feed_bell import AWAKE, MOST_PAUSE, SAFETY, Doorbell
from .raw import command

Entries = list[tuple[str, dict[str, str]]]
"""A stream's entries as read: (entry id, fields)."""


@port
class GroupReads:
    """The reads of ``streams`` by consumer ``consumer`` of ``group``, ``batch`` entries a
    stream at most; a blocking read waits up to ``block_ms``; on a cluster, a poll that found
    nothing is followed by a pause, from :attr:`poll_interval` up (see :mod:`.feed_bell`)."""

    def __init__(
        self,
        redis: Store,
        group: str,
        consumer: str,
        streams: Sequence[str],
        *,
        batch: int,
        block_ms: int,
    ) -> None:
        self.redis = commands(redis)
        self.group = group
        self.consumer = consumer
        self.streams = list(streams)
        self.batch = batch
        self.block_ms = block_ms
        self.poll_interval = 0.05
        self._direct = direct_calls(redis, dedicated=True)  # its reads block
        self._unacked: list[tuple[str, list[str]]] = []
        self._packed: dict[tuple[str, bool], bytes] = {}
        self._bell = Doorbell(redis, self.streams) if is_cluster(redis) else None
        self._pause = self.poll_interval
        self._active = 0.0
        self._hot: dict[str, float] = {}
        """Streams whose bell rang, or that had entries, and when (see :mod:`.feed_bell`)."""
        self._all_due = 0.0
        self.caught_up = False
        """Whether the last read of new entries found none: nothing is waiting to be read."""

    @property
    def bare(self) -> bool:
        """Whether reads have gone on the own client's connection (one server over TCP or Unix)."""
        return bool(self._packed)

    def ack(self, stream: str, ids: list[str]) -> None:
        """Acknowledge ``ids`` of ``stream`` with the next read (or :meth:`flush`)."""
        self._unacked.append((stream, ids))

    async def flush(self) -> None:
        """Send the acknowledgements not sent yet, now."""
        if self._unacked:
            async with self.redis.pipeline(transaction=False) as pipe:
                self._queue_acks(pipe)
                await pipe.execute()

    async def read(self, pending: bool) -> list[tuple[str, Entries]]:
        """The entries of every stream (only those that have some): those delivered to this
        consumer and not acknowledged (``pending``), or new ones (a blocking read, except on
        a cluster)."""
        found = await self._read(pending)
        if not pending:
            self.caught_up = not found
        return found

    async def _read(self, pending: bool) -> list[tuple[str, Entries]]:
        start = "0" if pending else ">"
        if self._direct is not None:
            return await reconnecting(lambda: self._read_direct(start, pending))
        if self._bell is not None:
            return await self._poll(start, pending)
        # The previous batch's acknowledgements travel with this read: one round trip.
        async with self.redis.pipeline(transaction=False) as pipe:
            self._queue_acks(pipe)
            pipe.xreadgroup(
                self.group,
                self.consumer,
                dict.fromkeys(self.streams, start),
                count=self.batch,
                block=None if pending else self.block_ms,
            )
            replies = (await pipe.execute())[-1]
        return [(stream, entries) for stream, entries in replies or [] if entries]

    async def _poll(self, start: str, pending: bool) -> list[tuple[str, Entries]]:
        """A cluster's read: every stream polled, then, when nothing was found, a pause."""
        await self.flush()
        began = self._now()
        replies: list[Any] = []
        streams = self._to_poll(began, pending)
        if streams:
            async with self.redis.pipeline(transaction=False) as pipe:
                for stream in streams:
                    pipe.xreadgroup(self.group, self.consumer, {stream: start}, count=self.batch)
                replies = await pipe.execute()
        found = [(s, e) for reply in replies for s, e in (reply or []) if e]
        for stream, _ in found:
            self._hot[stream] = began
        if found:
            self._woken()
        elif not pending:
            await self._rest(began)
        return found

    def _to_poll(self, began: float, pending: bool) -> list[str]:
        """The streams a poll begun at ``began`` reads: every one (pending entries; the
        bells perhaps unheard; :data:`~.feed_bell.SAFETY` seconds since the last such
        poll), or the hot ones."""
        assert self._bell is not None
        rung = self._bell.take()
        if pending or rung is None or began >= self._all_due:
            self._all_due = began + SAFETY
            return self.streams
        for stream in rung:
            self._hot[stream] = began
        self._hot = {s: t for s, t in self._hot.items() if began - t < AWAKE}
        return [stream for stream in self.streams if stream in self._hot]

    async def _rest(self, began: float) -> None:
        """The pause after a poll (begun at loop time ``began``) that found nothing: one
        that doubles, up to :data:`~.feed_bell.MOST_PAUSE`, or, once nothing was found or
        heard for :data:`~.feed_bell.AWAKE` seconds, until a bell (or
        :data:`~.feed_bell.SAFETY` seconds); a bell cuts either short."""
        bell = self._bell
        assert bell is not None
        bell.start()
        if bell.listening and began - self._active >= AWAKE:
            rang = await bell.wait(SAFETY)
        else:
            rang = await bell.wait(self._pause)
            self._pause = min(self._pause * 2, MOST_PAUSE)
        if rang:
            self._woken()

    def _woken(self) -> None:
        """Something was found or a bell rang: poll as often as :attr:`poll_interval` says."""
        self._active = self._now()
        self._pause = self.poll_interval

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def aclose(self) -> None:
        if self._direct is not None:
            self._direct.close()
        if self._bell is not None:
            await self._bell.aclose()

    def _queue_acks(self, pipe: Any) -> None:
        for stream, ids in self._unacked:
            pipe.xack(stream, self.group, *ids)
        self._unacked = []

    async def _read_direct(self, start: str, pending: bool) -> list[tuple[str, Entries]]:
        """:meth:`read` on the own client's connection: the acknowledgements and the read in one
        write."""
        assert self._direct is not None
        acks, self._unacked = self._unacked, []
        packed = b"".join([command("XACK", s, self.group, *ids) for s, ids in acks])
        try:
            replies = await self._direct.send(
                packed + self._read_command(start, pending), len(acks) + 1, self.block_ms / 1000
            )
        except RedisError:
            self._unacked = acks + self._unacked  # sent again with the next read
            raise
        found = []
        for stream, entries in replies[-1] or []:
            if entries:
                found.append((stream, [(i, _fields(f)) for i, f in entries]))
        return found

    def _read_command(self, start: str, pending: bool) -> bytes:
        """The read of every stream, packed once (515 arguments for the projector's feeds:
        its packing was a tenth of a projector's samples at the soak)."""
        key = (start, pending)
        if key not in self._packed:
            read: list[Any] = ["XREADGROUP", "GROUP", self.group, self.consumer]
            read += ["COUNT", self.batch]
            if not pending:
                read += ["BLOCK", self.block_ms]
            read += ["STREAMS", *self.streams, *[start] * len(self.streams)]
            self._packed[key] = command(*read)
        return self._packed[key]


def _fields(flat: list[str] | None) -> dict[str, str]:
    """A stream entry's fields from hiredis's flat list (None: an entry trimmed meanwhile)."""
    return dict(zip(flat[::2], flat[1::2], strict=True)) if flat else {}
