"""The live feed on a Redis Cluster: redis-py's sharded pub/sub, read node by node.

A shard channel lives on the node that holds its slot, so a feed's subscriptions are spread
over connections to several nodes (redis-py's ``ClusterPubSub`` keeps one ``PubSub`` per
node, in ``node_pubsub_mapping``). :class:`ClusterFeed` reads each of them with a task of its
own and hands what they read to :meth:`ClusterFeed.read_batch` as one batch:

- the nodes change (a failover, a resharding): every read looks for nodes that hold a
  subscription of the feed and have no reader yet, and a reader whose node no longer holds
  any ends;
- a subscription sent to a slot's old owner gets a MOVED *reply*, read by the node's reader:
  :func:`~.cluster.follow_redirect` teaches the client the new owner, which moves the
  subscription;
- one reader per node connection: two readers of one connection fail each other, so a
  reader replaced meanwhile ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..loops import cancel_and_wait
from .client import Store, cluster_client, commands
from .cluster import follow_redirect
from .subscriber import Message

WAIT = 1.0
"""Seconds :meth:`ClusterFeed.read_batch` waits for messages before it answers none."""
READ_PAUSE = 0.5
"""Seconds a node's reader waits after a failed read."""
HELD = 10_000
"""Messages read and not yet taken by :meth:`ClusterFeed.read_batch` past which the nodes'
readers wait for it (as a server's socket would fill, rather than the feed's memory)."""


class ClusterFeed:
    """Sharded pub/sub subscriptions on a Redis Cluster, one reader per node."""

    def __init__(self, redis: Store) -> None:
        self._redis = cluster_client(redis)
        self._pubsub: Any = commands(redis).pubsub()
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._arrived: list[Message] = []
        self._failure: ConnectionError | None = None
        self._wake = asyncio.Event()
        self._taken = asyncio.Event()
        self._mapped = False
        self._closed = False

    async def ssubscribe(self, *channels: str) -> None:
        if self._closed:
            raise ConnectionError("the live feed is closed")
        if not self._mapped:
            await self._redis.initialize()  # pub/sub needs the slot map first
            self._mapped = True
        await self._pubsub.ssubscribe(*channels)
        self._watch()

    async def sunsubscribe(self, *channels: str) -> None:
        if not self._closed:
            await self._pubsub.sunsubscribe(*channels)

    async def read_batch(self) -> list[Message]:
        if self._closed:
            raise ConnectionError("the live feed is closed")
        self._watch()
        if not self._arrived and self._failure is None:
            if not self._readers:
                # The node gave the channels up (a failover: ``sunsubscribe``): redis-py
                # would answer None at once, without waiting, for ever.
                raise ConnectionError("no cluster node holds a subscription of this feed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WAIT):
                    await self._wake.wait()
        self._wake.clear()
        batch, self._arrived = self._arrived, []
        self._taken.set()
        if batch:
            if self._failure is not None:
                self._wake.set()  # raised by the next read
            return batch
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        return batch

    async def ping(self, data: str) -> bool:
        # A node's pong reaches redis-py's per-node ``PubSub`` as a bare string, which it
        # takes apart into a message of type "p" (redis-py 8.1; the pong a probe waits for
        # never comes): no pings here, the caller publishes its probes.
        return False

    async def aclose(self) -> None:
        self._closed = True
        readers, self._readers = list(self._readers.values()), {}
        await cancel_and_wait(*readers)
        self._wake.set()
        await self._pubsub.aclose()

    def _watch(self) -> None:
        """A reader for each node that holds a subscription and has none (nodes change on
        failover and resharding)."""
        if self._closed:
            return
        for name in list(self._pubsub.node_pubsub_mapping):
            reader = self._readers.get(name)
            if reader is None or reader.done():
                task = asyncio.create_task(self._read_node(name), name=f"live-feed-{name}")
                self._readers[name] = task

    async def _read_node(self, name: str) -> None:
        """Read one node's connection until it holds none of our subscriptions."""
        while self._readers.get(name) is asyncio.current_task():
            if name not in self._pubsub.node_pubsub_mapping:
                self._readers.pop(name, None)
                self._wake.set()  # the reader looks around (and may find none left)
                return
            node = self._redis.get_node(node_name=name)
            if node is None:
                # Not in the client's map now (it is being reloaded): without a node,
                # redis-py would read every node's connection, under their own readers.
                await asyncio.sleep(0.1)
                continue
            try:
                message = await self._pubsub.get_sharded_message(target_node=node, timeout=WAIT)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if _cancelling():  # redis-py can turn a cancellation into another error
                    raise asyncio.CancelledError from None
                if await follow_redirect(self._redis, exc):
                    continue  # an ssubscribe sent to a slot's old owner: it moves now
                failure = ConnectionError(f"pub/sub read from node {name} failed: {exc!r}")
                failure.__cause__ = exc
                self._failure = failure
                self._wake.set()
                await asyncio.sleep(READ_PAUSE)
                continue
            if message is not None:
                self._arrived.append(message)
                self._wake.set()
                if len(self._arrived) >= HELD:
                    self._taken.clear()
                    await self._taken.wait()
            self._watch()  # a channel whose slot moved: its new node


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
