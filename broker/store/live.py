"""The live feed: sharded pub/sub subscriptions, whatever the store's topology.

The roles hear what is published live (a session's events, a node's replies, the index's
announcements) through a :class:`LiveFeed`, which :func:`open_live_feed` makes: the one
place that chooses how, by the store's topology (:func:`~.client.topology`):

* one Redis server where the store has its own client (plain TCP or a Unix socket):
  :class:`~.own_feed.OwnSubscriber`, a subscribed connection of that client's, every
  message the socket brought read in one batch (the fan-out's fast path);
* one Redis server otherwise (TLS, a Sentinel master, the embedded store):
  :class:`~.subscriber.BulkSubscriber`, redis-py's ``PubSub`` on a connection of the
  client's pool, read in bulk;
* a Redis Cluster: :class:`~.cluster_feed.ClusterFeed`, redis-py's sharded pub/sub with a
  reader per node the subscriptions live on, following MOVED and slot moves.

Every engine delivers the same messages, ``{"type", "channel", "data"}``, in the order the
server pushed them on a connection:

* ``smessage``: a message published on a subscribed channel;
* ``ssubscribe``: a channel is subscribed, the first time and again after every reconnection
  the engine made by itself (what was published in between is unknown to the feed: the
  signal to read it from the log, or to start a cache empty);
* ``sunsubscribe``: a channel left, asked for or not (a slot that moved to another node, a
  failover): the caller subscribes again where it wants the channel still;
* ``pong`` (channel None): the answer to :meth:`LiveFeed.ping`, after every message pushed
  to that connection before it.

A feed that went deaf raises ``ConnectionError`` from :meth:`LiveFeed.read_batch`; the
next read reconnects and subscribes again to every channel. A feed that stays silent while
its caller's probes go unheard is closed by its caller and replaced by a new one.
"""

from __future__ import annotations

from typing import Protocol

from .boundary import port
from .client import Store, Topology, commands, topology
from .cluster_feed import ClusterFeed
from .own_client import OwnClient
from .own_feed import OwnSubscriber
from .subscriber import BulkSubscriber, Message

__all__ = ["LiveFeed", "Message", "Publisher", "open_live_feed"]


class LiveFeed(Protocol):
    """A node's sharded pub/sub subscriptions: subscribe, unsubscribe, read, probe, close."""

    async def ssubscribe(self, *channels: str) -> None:
        """Subscribe to ``channels`` (their ``ssubscribe`` confirmations come as messages)."""
        ...

    async def sunsubscribe(self, *channels: str) -> None:
        """Leave ``channels`` (best effort; their ``sunsubscribe`` may come as messages)."""
        ...

    async def read_batch(self) -> list[Message]:
        """The messages that have arrived, in order: waits for some (an engine may return
        none after a while, so that its caller gets to look around).

        Raises ConnectionError when the connection failed; the next call reconnects and
        subscribes to every channel again (what arrived meanwhile is lost: the caller
        finds it elsewhere, e.g. in the log)."""
        ...

    async def ping(self, data: str) -> bool:
        """Send ``PING data`` on the subscription's own connection(s): its ``pong``
        (``data``) comes back among the messages. False: this engine cannot (the caller
        probes another way, e.g. by publishing to itself)."""
        ...

    async def aclose(self) -> None:
        """Close the feed: its subscriptions end, :meth:`read_batch` raises from now."""
        ...


def open_live_feed(redis: Store) -> LiveFeed:
    """A new, empty feed on the store ``redis`` is a client of, by the fastest engine its
    topology allows (see the module's description)."""
    if topology(redis) is Topology.CLUSTER:
        return ClusterFeed(redis)
    if isinstance(redis, OwnClient):
        return OwnSubscriber(redis.connections)
    return BulkSubscriber(commands(redis).pubsub())


@port
class Publisher:
    """Publishing on the live feed's channels (``SPUBLISH``): a session's channel, a
    node's reply channel, the index's announcements."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)

    async def publish(self, channel: str, data: str) -> int:
        """Publish ``data`` on ``channel``; how many subscribers heard it (0: none, see
        :func:`~.retry.unheard`)."""
        return int(await self.redis.spublish(channel, data))
