"""Calls in the shape RESP gives their replies, on the own client's connections where the
store has its own client.

The hottest reads (a ``session/list`` page, a log's reads and batch appends, a consumer's
stream reads) want the reply as the server sent it (a page is sent on as it was read) and
no reply callback. :class:`DirectCalls` makes them on the connections of the store's own
client (:class:`~.own_client.OwnClient`, one server over plain TCP or a Unix socket): its
shared connection, on which calls overlap as Redis pipelines them, or one of its own for a
consumer that blocks. Callers write a call once, on :class:`StoreCalls`
(:func:`store_calls`), which decides by topology: those connections where the store has
its own client, redis-py's client otherwise (a cluster, TLS, a Sentinel master, the
embedded store), whose replies are put back in RESP's shape (:func:`as_resp`). Either way
a call has one path, one breaker and one retry policy (:func:`reconnecting`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from hiredis import ReplyError
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from ..compat.redis import error_from_reply
from .breaker import StoreBreaker
from .client import Store, commands
from .connections import UTF8, ServerConnections
from .connections import reconnecting as reconnecting  # where its callers find it
from .own_client import OwnClient
from .raw import RawConnection

T = TypeVar("T")


def direct_calls(
    redis: Store, encoding: str | None = UTF8, *, dedicated: bool = False
) -> DirectCalls | None:
    """A :class:`DirectCalls` on the connections of ``redis`` when it is the store's own
    client; None for the others (a cluster, TLS, a Sentinel master, the embedded store).
    ``encoding``: how the replies' strings are decoded (None: they stay bytes);
    ``dedicated``: on a connection of its own (a caller whose reads block), not the shared
    one."""
    if not isinstance(redis, OwnClient):
        return None
    return DirectCalls(redis.connections, encoding, dedicated=dedicated)


class DirectCalls:
    """Commands on the own client's connections, replies as RESP gives them."""

    def __init__(
        self, connections: ServerConnections, encoding: str | None = UTF8, *, dedicated: bool
    ) -> None:
        self._connections = connections
        self._encoding = encoding
        self._dedicated = dedicated
        self._own: RawConnection | None = None
        self._connecting = asyncio.Lock()
        self.timeout = connections.timeout
        """Seconds a call waits for its reply (then it fails)."""
        self.breaker: StoreBreaker = connections.breaker
        """While it says the store is away, calls fail at once (see :mod:`.breaker`)."""

    def _open(self) -> RawConnection | None:
        """The connection calls go on, if it is open now."""
        if self._dedicated:
            own = self._own
            return None if own is None or own.lost else own
        return self._connections.open_shared(self._encoding)

    async def call(self, *command: Any, deadline: float | None = None) -> Any:
        """The reply to ``command``. Raises redis-py's errors: an error reply's (as the
        client raises it), ``ConnectionError`` or ``TimeoutError``.

        ``deadline`` (the event loop's time): opening a connection (if none is open) and
        the reply share it; without one, each has its own timeout."""
        if self.breaker.away:
            raise self.breaker.error()
        connection = self._open() or await self._connect(deadline)
        return await connection.call(*command, deadline=deadline)

    def calls(self, *commands: tuple[Any, ...], shared: bool = False) -> Awaitable[list[Any]]:
        """The replies to several commands sent together (see :meth:`call`); ``shared``:
        reads whose replies may be shared (see :class:`~.raw.RawConnection`).

        On an open connection, its own coroutine (no frame around it on the read each
        connect's ``session/resume`` makes); the breaker's error is raised at the call."""
        if self.breaker.away:
            raise self.breaker.error()
        connection = self._open()
        if connection is None:
            return self._calls_opening(commands, shared)
        return connection.calls(*commands, shared=shared)

    async def _calls_opening(
        self, commands: tuple[tuple[Any, ...], ...], shared: bool
    ) -> list[Any]:
        connection = await self._connect()
        return await connection.calls(*commands, shared=shared)

    def request(self, *command: Any) -> tuple[RawConnection, asyncio.Future[Any]] | None:
        """``command`` sent now on the open connection, and the future of its reply (see
        :meth:`RawConnection.request`), with the connection that reads it out
        (:meth:`RawConnection.result`); None while no connection is open (:meth:`call`
        opens one)."""
        connection = self._open()
        if connection is None or self.breaker.away:
            return None
        return connection, connection.request(*command)

    async def send(self, packed: bytes, count: int, wait: float = 0.0) -> list[Any]:
        """The replies to ``count`` commands packed already (see :meth:`RawConnection.send`)."""
        if self.breaker.away:
            raise self.breaker.error()
        connection = self._open() or await self._connect()
        return await connection.send(packed, count, wait)

    async def _connect(self, deadline: float | None = None) -> RawConnection:
        """The open connection, or a new one, by ``deadline`` (the event loop's time;
        default: the connect timeout from now), waiting for another caller's open
        included; else redis-py's ``ConnectionError``."""
        if not self._dedicated:
            return await self._connections.shared(self._encoding, deadline)
        loop = asyncio.get_running_loop()
        due = loop.time() + self._connections.connect_timeout if deadline is None else deadline
        try:
            async with asyncio.timeout_at(due):
                await self._connecting.acquire()
        except TimeoutError:
            raise RedisConnectionError("could not connect: another open still waits") from None
        try:
            own = self._own
            if own is None or own.lost:
                own = self._own = await self._connections.dedicated(
                    self._encoding, due - loop.time()
                )
            return own
        finally:
            self._connecting.release()

    async def loading(self, script: AsyncScript, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()``, a call that runs ``script`` by ``EVALSHA``; when the server does
        not know it (a restart emptied its cache), it is loaded, and called again."""
        try:
            return await call()
        except NoScriptError:
            await self.call("SCRIPT", "LOAD", script.script)
            return await call()

    def close(self) -> None:
        """Close the connection of its own (the shared one is the client's)."""
        if self._own is not None:
            self._own.close()


def store_calls(redis: Store, *, encoding: str | None = UTF8) -> StoreCalls:
    """:class:`StoreCalls` on ``redis``."""
    return StoreCalls(redis, direct_calls(redis, encoding))


class StoreCalls:
    """Commands whose callers write them once, in the shape RESP gives their replies: on the
    own client's connections (:class:`DirectCalls`) where the store has its own client,
    else through redis-py's client, whose replies are put back in RESP's shape
    (:func:`as_resp`). One path per topology, never both for a call."""

    def __init__(self, redis: Store, direct: DirectCalls | None) -> None:
        self.redis = commands(redis)
        self.direct = direct
        """The own client's calls; None where redis-py's client carries every call."""

    async def call(self, *command: Any) -> Any:
        """The reply to ``command``."""
        direct = self.direct
        if direct is not None:
            return await reconnecting(lambda: direct.call(*command))
        return as_resp(command[0], await self.redis.execute_command(*command))

    async def calls(self, *commands: tuple[Any, ...], shared: bool = False) -> list[Any]:
        """The replies to several commands sent together (one round trip on one server);
        ``shared``: reads whose replies may be shared (see :class:`~.raw.RawConnection`)."""
        direct = self.direct
        if direct is not None:
            return await reconnecting(lambda: direct.calls(*commands, shared=shared))
        async with self.redis.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            replies = await pipe.execute()
        return [as_resp(c[0], r) for c, r in zip(commands, replies, strict=True)]

    async def script(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """The reply of ``script`` (what ``redis.register_script`` made) run on ``keys`` and
        ``args``, an error among its replies as the client gives it: by ``EVALSHA`` on the
        own client's connection (the script loaded there first if the server does not know it: a
        restart emptied its cache), else through the client (:meth:`run_script`). A script
        sent twice after a lost connection must be one that a second run does no harm (the
        log's appends carry their call ids)."""
        direct = self.direct
        if direct is None:
            return await self.run_script(script, keys, args)

        # Opening a connection (a first call, or after a lost one) and the reply share one
        # deadline: a handshake that stalls does not add a whole reply timeout after it.
        deadline = asyncio.get_running_loop().time() + direct.timeout
        run = ("EVALSHA", script.sha, len(keys), *keys, *args)
        reply = await reconnecting(
            lambda: direct.loading(script, lambda: direct.call(*run, deadline=deadline)),
            deadline,
        )
        return _errors_as_redis_py(reply)

    async def run_script(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """``script`` run through the client. A node that just became a master may not know
        the script, and redis-py's reload can go to the nodes it knew before the failover:
        then ``EVAL`` goes by key."""
        try:
            return await script(keys=keys, args=args)
        except NoScriptError:
            return await self.redis.eval(script.script, len(keys), *keys, *args)

    def close(self) -> None:
        if self.direct is not None:
            self.direct.close()


def _errors_as_redis_py(reply: Any) -> Any:
    """A script's reply read by hiredis, with each error among its items as redis-py's
    client gives it (:func:`~broker.compat.redis.error_from_reply`)."""
    if isinstance(reply, list):
        return [error_from_reply(str(r)) if isinstance(r, ReplyError) else r for r in reply]
    return reply


def as_resp(name: str, reply: Any) -> Any:
    """``reply`` as the own client's connections read it: redis-py's reply callbacks undone for the
    commands read through :class:`StoreCalls` whose shape they change (a hash's fields and
    values as one flat list, a stream entry's too)."""
    kind = name.upper()
    if kind == "HGETALL" and isinstance(reply, dict):
        return [x for pair in reply.items() for x in pair]
    if kind in ("XRANGE", "XREVRANGE") and isinstance(reply, list):
        return [[i, [x for pair in (f or {}).items() for x in pair]] for i, f in reply]
    return reply
