"""Reading several streams through one consumer group, acknowledgements included, in as
few round trips as the store's topology allows.

* One Redis server over plain TCP or a Unix socket: the acknowledgements of the previous
  read and the next read go in one write on a bare connection (:mod:`.direct`), the reply
  parsed by hiredis (redis-py's pipeline, its packing and its reply callbacks were a
  quarter of a projector's samples at the soak). When that connection fails, the same read
  goes through the client, which knows how to recover.
* Through the client (TLS, a Sentinel master, the embedded store): the acknowledgements and
  one blocking ``XREADGROUP`` of every stream, in one pipeline.
* A Redis Cluster: the streams live in different slots, which one command may not span:
  the acknowledgements go first, then a pipeline polls each stream (no blocking read).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from .client import Store, is_cluster
from .direct import direct_calls
from .raw import command

Entries = list[tuple[str, dict[str, str]]]
"""A stream's entries as read: (entry id, fields)."""


class GroupReads:
    """The reads of ``streams`` by consumer ``consumer`` of ``group``, ``batch`` entries a
    stream at most; a blocking read waits up to ``block_ms``; on a cluster, a poll that found
    nothing is followed by a pause of :attr:`poll_interval`."""

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
        self.redis = redis
        self.group = group
        self.consumer = consumer
        self.streams = list(streams)
        self.batch = batch
        self.block_ms = block_ms
        self.poll_interval = 0.05
        self._direct = direct_calls(redis)
        self._unacked: list[tuple[str, list[str]]] = []
        self._packed: dict[tuple[str, bool], bytes] = {}

    @property
    def bare(self) -> bool:
        """Whether reads have gone on the bare connection (one server over TCP or Unix)."""
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
        start = "0" if pending else ">"
        if self._direct is not None:
            with contextlib.suppress(RedisError):  # the client's way recovers from anything
                return await self._read_direct(start, pending)
        if not is_cluster(self.redis):
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
        await self.flush()
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xreadgroup(self.group, self.consumer, {stream: start}, count=self.batch)
            replies = await pipe.execute()
        found = [(s, e) for reply in replies for s, e in (reply or []) if e]
        if not found and not pending:
            await asyncio.sleep(self.poll_interval)
        return found

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()

    def _queue_acks(self, pipe: Any) -> None:
        for stream, ids in self._unacked:
            pipe.xack(stream, self.group, *ids)
        self._unacked = []

    async def _read_direct(self, start: str, pending: bool) -> list[tuple[str, Entries]]:
        """:meth:`read` on the bare connection: the acknowledgements and the read in one
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
