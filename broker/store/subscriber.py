"""The live feed (:mod:`.live`) on one server (standalone, a Sentinel master, the embedded
store): redis-py's ``PubSub``, read in bulk.

redis-py's ``PubSub`` makes the subscription: its connection comes from the client's pool
(the store's breaker gating it, TLS, credentials, the Sentinels' master followed), and when
that connection is opened again it subscribes again to every channel. The messages are
read on that connection in bulk: every message its parser holds, one batch to the hub.
``PubSub.get_message`` reads one message per call, each through a timeout context, a retry
wrapper, a health check and a message handler: 18-20 µs of CPU a message where the bulk
read takes about 6, and a batch of one message a call made a front write each message to
each watcher on its own (``bench fanout`` at S=1/W=1000: 4.4 times the CPU per delivery;
the figures are in ``docs/performance.md``). (Redis Cluster has its own engine,
:mod:`.cluster_feed`.)

The batch holds the messages :mod:`.live` describes. Under RESP3 (redis-py's default from
8.0) a message is a push and the answer to a ``PING`` a plain reply; under RESP2 both are
arrays: either is read here.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from redis.exceptions import RedisError, ResponseError

from ..ops import metrics

Message = dict[str, Any]

log = logging.getLogger(__name__)


class BulkSubscriber:
    """redis-py's ``PubSub`` (of the store's client), its messages read in bulk."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub
        self._closed = False
        self._connected_before = False

    async def ssubscribe(self, *channels: str) -> None:
        if self._closed:
            raise ConnectionError("the subscriber is closed")
        try:
            await self._pubsub.ssubscribe(*channels)
        except RedisError as exc:  # redis-py's own: the contract's is the builtin one
            raise ConnectionError(f"pub/sub could not subscribe: {exc}") from exc
        self._connected_before = True

    async def sunsubscribe(self, *channels: str) -> None:
        if self._closed or self._pubsub.connection is None:
            return
        try:
            await self._pubsub.sunsubscribe(*channels)
        except RedisError as exc:
            raise ConnectionError(f"pub/sub could not unsubscribe: {exc}") from exc

    async def read_batch(self) -> list[Message]:
        if self._closed:
            raise ConnectionError("the subscriber is closed")
        try:
            connection = await self._connection()
            replies = [await connection.read_response(timeout=math.inf, push_request=True)]
            while await connection.can_read():  # what the parser holds, or the socket has
                replies.append(await connection.read_response(timeout=math.inf, push_request=True))
        except ResponseError as exc:  # an error reply (a refused SSUBSCRIBE): said, not fatal
            log.warning("pub/sub: %s", exc)
            return []
        except (RedisError, OSError) as exc:
            raise ConnectionError(f"pub/sub connection failed: {exc}") from exc
        return messages(replies)

    async def _connection(self) -> Any:
        """The subscription's connection, opened again (every channel subscribed again by
        redis-py) if it was lost."""
        pubsub = self._pubsub
        connection = pubsub.connection
        if connection is not None and connection.is_connected:
            return connection
        await pubsub.connect()
        if self._connected_before:
            metrics.REDIS_RECOVERIES.labels("pub/sub connection").inc()
        self._connected_before = True
        return pubsub.connection

    async def ping(self, data: str) -> bool:
        connection = self._pubsub.connection
        if connection is None or not connection.is_connected:
            raise ConnectionError("pub/sub is not connected")
        try:
            await self._pubsub.ping(data)
        except RedisError as exc:
            raise ConnectionError(f"pub/sub ping failed: {exc}") from exc
        return True

    async def aclose(self) -> None:
        self._closed = True
        await self._pubsub.aclose()


def messages(replies: list[Any]) -> list[Message]:
    """The hub's messages in ``replies`` as read off a subscribed connection."""
    messages: list[Message] = []
    for reply in replies:
        if isinstance(reply, list) and len(reply) == 3:
            messages.append({"type": reply[0], "channel": reply[1], "data": reply[2]})
        elif isinstance(reply, list) and len(reply) == 2 and reply[0] == "pong":  # RESP2
            messages.append({"type": "pong", "channel": None, "data": reply[1]})
        elif isinstance(reply, str):  # RESP3: PING's reply is a plain one
            messages.append({"type": "pong", "channel": None, "data": reply})
    return messages
