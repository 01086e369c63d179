"""Two engines of the live feed (:mod:`.live`) on one server: read in bulk, or by redis-py.

* :class:`BatchSubscriber`, for a single Redis server over TCP or a Unix socket: it
  reads whatever the socket holds, parses it with hiredis in one go and hands every
  message it found to the hub as one batch. redis-py reads one message per call, each
  through a timeout context, a retry wrapper, a health check and a push-message
  handler; on a front fanning a thousand busy sessions out, that was a third of its
  CPU time (py-spy, ``bench fanout`` S=1000/W=2).
* :class:`RedisPySubscriber`: redis-py's ``PubSub``, for TLS, a Sentinel master and the
  embedded store. (Redis Cluster has its own, :mod:`.cluster_feed`.)

Both deliver the messages :mod:`.live` describes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import hiredis
from redis.exceptions import RedisError

from ..ops import metrics
from .raw import CONNECT_TIMEOUT, command, handshake

Message = dict[str, Any]

log = logging.getLogger(__name__)

_READ_BYTES = 1 << 16


class RedisPySubscriber:
    """redis-py's ``PubSub``, one message per read."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub
        self._closed = False

    async def ssubscribe(self, *channels: str) -> None:
        if self._closed:
            raise ConnectionError("the subscriber is closed")
        await self._pubsub.ssubscribe(*channels)

    async def sunsubscribe(self, *channels: str) -> None:
        await self._pubsub.sunsubscribe(*channels)

    async def read_batch(self) -> list[Message]:
        if self._closed:  # redis-py's would answer None, at once, for ever
            raise ConnectionError("the subscriber is closed")
        try:
            message = await self._pubsub.get_message(timeout=1.0)
        except RedisError as exc:  # redis-py's own: the contract's is the builtin one
            raise ConnectionError(f"pub/sub read failed: {exc!r}") from exc
        return [] if message is None else [message]

    async def ping(self, data: str) -> bool:
        # The embedded store answers a subscribed PING with a bare string, which redis-py
        # takes apart as a message of another type: no pings here.
        return False

    async def aclose(self) -> None:
        self._closed = True
        await self._pubsub.aclose()


class BatchSubscriber:
    """One connection to a single Redis server, subscribed with SSUBSCRIBE, read in bulk.

    ``options`` are redis-py's connection keyword arguments (host and port, or path;
    username and password).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self.channels: set[str] = set()
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._parser = hiredis.Reader(encoding="utf-8", errors="replace")
        self._connecting = asyncio.Lock()
        self._closed = False
        self._connected_before = False

    async def ssubscribe(self, *channels: str) -> None:
        self.channels.update(channels)
        if self._stream is None:
            await self._connect()  # subscribes to every channel, these included
        else:
            self._send("SSUBSCRIBE", *channels)

    async def sunsubscribe(self, *channels: str) -> None:
        self.channels.difference_update(channels)
        if self._stream is not None and channels:
            self._send("SUNSUBSCRIBE", *channels)

    async def read_batch(self) -> list[Message]:
        if self._closed:
            raise ConnectionError("the subscriber is closed")
        stream = self._stream
        if stream is None:
            await self._connect()
            stream = self._stream
            assert stream is not None
        try:
            data = await stream[0].read(_READ_BYTES)
        except OSError as exc:
            self._drop()
            raise ConnectionError(f"pub/sub connection failed: {exc}") from exc
        if not data:
            self._drop()
            raise ConnectionError("pub/sub connection closed by the server")
        self._parser.feed(data)
        try:
            return self._parsed()
        except hiredis.ProtocolError as exc:
            self._drop()
            raise ConnectionError(f"pub/sub protocol error: {exc}") from exc

    async def ping(self, data: str) -> bool:
        if self._stream is None:
            raise ConnectionError("pub/sub is not connected")
        self._send("PING", data)
        return True

    async def aclose(self) -> None:
        self._closed = True
        self._drop()

    def _parsed(self) -> list[Message]:
        messages: list[Message] = []
        while True:
            reply = self._parser.gets()
            if reply is False:
                return messages
            if isinstance(reply, list) and len(reply) == 3:
                messages.append({"type": reply[0], "channel": reply[1], "data": reply[2]})
            elif isinstance(reply, list) and len(reply) == 2 and reply[0] == "pong":
                messages.append({"type": "pong", "channel": None, "data": reply[1]})
            elif isinstance(reply, hiredis.ReplyError):
                log.warning("pub/sub: %s", reply)

    def _send(self, *args: str) -> None:
        assert self._stream is not None
        self._stream[1].write(command(*args))

    async def _connect(self) -> None:
        async with self._connecting:
            if self._stream is not None:
                return
            if self._closed:
                raise ConnectionError("the subscriber is closed")
            try:
                stream = await asyncio.wait_for(self._open(), CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                raise ConnectionError(f"pub/sub could not connect: {exc}") from exc
            self._parser = hiredis.Reader(encoding="utf-8", errors="replace")
            self._stream = stream
            if self._connected_before:
                metrics.REDIS_RECOVERIES.labels("pub/sub connection").inc()
            self._connected_before = True
            if self.channels:
                self._send("SSUBSCRIBE", *sorted(self.channels))

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        options = self._options
        if options.get("path"):
            reader, writer = await asyncio.open_unix_connection(options["path"])
        else:
            host, port = options.get("host", "localhost"), int(options.get("port", 6379))
            reader, writer = await asyncio.open_connection(host, port)
        for step in handshake(options):
            writer.write(command(*step))
            await _expect_ok(reader, writer)
        return reader, writer

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):  # a broken stream: dropped, it carries nothing
                stream[1].close()


async def _expect_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read one reply; anything but +OK closes the connection and raises ConnectionError."""
    parser = hiredis.Reader(encoding="utf-8", errors="replace")
    while True:
        data = await reader.read(_READ_BYTES)
        if not data:
            break
        parser.feed(data)
        reply = parser.gets()
        if reply is not False:
            if reply == "OK":
                return
            writer.close()
            raise ConnectionError(f"pub/sub handshake refused: {reply}")
    writer.close()
    raise ConnectionError("pub/sub connection closed during its handshake")
