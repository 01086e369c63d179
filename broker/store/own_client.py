"""The store's client of one Redis server over plain TCP or a Unix socket: every command on
the project's own connections (:mod:`.raw`, pooled by :mod:`.connections`).

redis-py's client path costs the broker's hot paths 1.7 to 4.4 times the CPU of a bare
connection (the pool's lock and condition, a retry wrapper, an event dispatcher and a
stream reader per call: ``docs/performance.md``, "One client path"), so on one server the
store does without it. :class:`OwnClient` is still redis-py's ``Redis`` to its callers
(:class:`~broker.compat.redis_sender.SendingClient`: the same command builders, reply
callbacks and exceptions), so every port reads the same on every topology; its commands
go on :class:`~.connections.ServerConnections`: one pool, the store's one breaker, one
retry policy (:func:`~.connections.reconnecting`). The protocol is RESP2 (no ``HELLO``).

TLS, a Sentinel master, a cluster and the embedded store keep redis-py's client
throughout: one path per topology, never both for a call.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.connection import ConnectionPool

from ..compat.redis_sender import SendingClient
from .breaker import StoreBreaker
from .connections import UTF8, ServerConnections, reconnecting
from .raw import command

BLOCKING_FOREVER = 86_400.0
"""Seconds a blocking command asked to wait without end may wait here."""

_LIST_POPS = frozenset({"BLPOP", "BRPOP", "BZPOPMIN", "BZPOPMAX", "BRPOPLPUSH", "BLMOVE"})
"""Blocking commands whose last argument is their timeout, in seconds."""


class OwnClient(SendingClient):
    """redis-py's client of one server whose commands go on :attr:`connections`."""

    connections: ServerConnections

    @classmethod
    def over(
        cls, pool: ConnectionPool, breaker: StoreBreaker, *, size: int, wait: float
    ) -> OwnClient:
        """The client of the server ``pool`` names (its options, RESP2; the pool itself
        opens nothing for the broker), gated by ``breaker``, holding at most ``size``
        connections for blocking commands (past that a caller waits up to ``wait`` s)."""
        client = cls(connection_pool=pool)
        client.auto_close_connection_pool = True  # as ``Redis.from_pool`` makes it
        client.connections = ServerConnections(dict(pool.connection_kwargs), breaker, size, wait)
        client.sender = OwnSender(client.connections)
        return client


class OwnSender:
    """Commands on :class:`~.connections.ServerConnections`: the shared connection, or a
    held one for a command that blocks; a lost connection tried again on a fresh one."""

    def __init__(self, connections: ServerConnections) -> None:
        self.connections = connections

    async def reply(self, args: tuple[Any, ...], decode: bool) -> Any:
        encoding = UTF8 if decode else None
        block = blocking_wait(args)
        if block is None:
            return await reconnecting(lambda: self._call(args, encoding))
        return await reconnecting(lambda: self._call_held(args, encoding, block))

    async def _call(self, args: tuple[Any, ...], encoding: str | None) -> Any:
        connection = await self.connections.shared(encoding)
        return await connection.call(*args)

    async def _call_held(self, args: tuple[Any, ...], encoding: str | None, block: float) -> Any:
        async with self.connections.held(encoding) as connection:
            deadline = asyncio.get_running_loop().time() + connection.timeout + block
            return await connection.call(*args, deadline=deadline)

    async def replies(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        packed = b"".join([command(*args) for args in commands])
        waits = [w for w in map(blocking_wait, commands) if w is not None]

        async def send() -> list[Any]:
            if not waits:
                connection = await self.connections.shared(UTF8)
                return await connection.replies(packed, len(commands))
            async with self.connections.held(UTF8) as connection:
                return await connection.replies(packed, len(commands), max(waits))

        return await reconnecting(send)

    def close(self) -> None:
        self.connections.close()


def blocking_wait(args: tuple[Any, ...] | list[Any]) -> float | None:
    """Seconds command ``args`` may block the connection it is sent on (None: it does
    not): a stream read with ``BLOCK``, ``WAIT``, a blocking pop."""
    name = args[0]
    name = (name if isinstance(name, str) else bytes(name).decode()).upper()
    if name in ("XREAD", "XREADGROUP"):
        for position, arg in enumerate(args):
            if isinstance(arg, str | bytes) and arg.upper() in ("BLOCK", b"BLOCK"):
                return _waits(int(args[position + 1]) / 1000)
        return None
    if name == "WAIT":
        return _waits(int(args[2]) / 1000)
    if name in _LIST_POPS:
        return _waits(float(args[-1]))
    if name in ("BLMPOP", "BZMPOP"):
        return _waits(float(args[1]))
    return None


def _waits(seconds: float) -> float:
    """A blocking command's wait in seconds, 0 being without end."""
    return seconds if seconds > 0 else BLOCKING_FOREVER
