"""The live feed (:mod:`.live`) where the store has its own client (:mod:`.own_client`):
the subscriptions on a connection of its own, every message the socket brought read in one
batch.

A subscribed connection is a :class:`~.raw.RawConnection` (opened, authenticated and its
database selected like any other) that, once subscribed, takes every reply as a pushed
message: ``smessage``, ``ssubscribe`` / ``sunsubscribe`` confirmations, and ``pong`` (RESP2:
no ``HELLO``, so a message is an array, the answer to ``PING`` ``["pong", data]``). A
lost connection fails the read that waits (``ConnectionError``); the next read opens
another and subscribes again to every channel, whose confirmations say so. A refused
subscription (``NOPERM``) comes as an error reply among the messages: it is logged, not
fatal, as redis-py's engine does (:class:`~.subscriber.BulkSubscriber`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import hiredis
from redis.exceptions import RedisError

from ..ops import metrics
from .connections import ServerConnections
from .raw import RawConnection, command
from .subscriber import Message, messages

log = logging.getLogger(__name__)


class SubscribedConnection(RawConnection):
    """A connection whose replies, once :meth:`subscribe` was called, are pushed messages
    kept for :meth:`batch`."""

    def __init__(self, encoding: str | None = "utf-8") -> None:
        super().__init__(encoding)
        self.subscribed = False
        self._pushed: list[Any] = []
        self._arrived: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        if not self.subscribed:
            super().data_received(data)
            return
        reader = self._reader
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                self._pushed.append(reply)
        except hiredis.ProtocolError:
            self.close()
            return
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_exception(ConnectionError(f"pub/sub connection lost: {exc}"))

    def write(self, *args: Any) -> None:
        """Send ``args`` as a command whose answer comes as a message (subscribed)."""
        self.subscribed = True
        if self.lost or self._transport is None:
            raise ConnectionError("pub/sub is not connected")
        self._transport.write(command(*args))

    async def batch(self) -> list[Any]:
        """Every message that has arrived, waiting for one if none has."""
        while not self._pushed:
            if self.lost:
                raise ConnectionError("pub/sub connection lost")
            self._arrived = asyncio.get_running_loop().create_future()
            await self._arrived
        pushed, self._pushed = self._pushed, []
        return pushed


class OwnSubscriber:
    """A :class:`~.live.LiveFeed` on the own client's connections."""

    def __init__(self, connections: ServerConnections) -> None:
        self._connections = connections
        self._channels: set[str] = set()
        self._connection: SubscribedConnection | None = None
        self._opening = asyncio.Lock()
        self._closed = False
        self._connected_before = False

    async def ssubscribe(self, *channels: str) -> None:
        connection = await self._connected()
        self._channels.update(channels)
        connection.write("SSUBSCRIBE", *channels)

    async def sunsubscribe(self, *channels: str) -> None:
        self._channels.difference_update(channels)
        connection = self._connection
        if self._closed or connection is None or connection.lost:
            return
        connection.write("SUNSUBSCRIBE", *channels)

    async def read_batch(self) -> list[Message]:
        lost = self._connection
        if lost is not None and lost.lost:  # said once; the next read opens another
            self._connection = None
            raise ConnectionError("pub/sub connection lost")
        connection = await self._connected()
        try:
            replies = await connection.batch()
        except ConnectionError:
            if self._connection is connection:
                self._connection = None  # said; the next read opens another
            raise
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):  # a refused SSUBSCRIBE: said, not fatal
                log.warning("pub/sub: %s", reply)
        return messages([r for r in replies if not isinstance(r, hiredis.ReplyError)])

    async def ping(self, data: str) -> bool:
        connection = self._connection
        if connection is None or connection.lost:
            raise ConnectionError("pub/sub is not connected")
        connection.write("PING", data)
        return True

    async def _connected(self) -> SubscribedConnection:
        """The subscriptions' connection, opened again (every channel subscribed again)
        if it was lost."""
        if self._closed:
            raise ConnectionError("the subscriber is closed")
        connection = self._connection
        if connection is not None and not connection.lost:
            return connection
        async with self._opening:
            connection = self._connection
            if connection is None or connection.lost:
                try:
                    connection = await self._connections.dedicated(kind=SubscribedConnection)
                except (OSError, TimeoutError, RedisError) as exc:
                    raise ConnectionError(f"pub/sub could not connect: {exc}") from exc
                if self._closed:
                    connection.close()
                    raise ConnectionError("the subscriber is closed")
                self._connection = connection
                if self._connected_before:
                    metrics.REDIS_RECOVERIES.labels("pub/sub connection").inc()
                self._connected_before = True
                if self._channels:
                    connection.write("SSUBSCRIBE", *sorted(self._channels))
            return connection

    async def aclose(self) -> None:
        self._closed = True
        if self._connection is not None:
            self._connection.close()
