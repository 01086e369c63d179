"""One connection for a front's hottest read, past redis-py's client layers.

``session/list`` makes one ``ZRANGE`` a page. Through redis-py's client a call
crosses the connection pool (a lock, a condition, a timeout), a retry wrapper, an event
dispatcher and a stream reader on its way out and back: 73 µs of CPU a call, where a bare
connection spends 30 (``python -m bench requests``). :class:`DirectCalls` keeps one
:class:`~.raw.RawConnection` to the store's server (its credentials, its database), on
which calls overlap as Redis pipelines them. (The 73 and 30 µs were measured on a script
call, when a page was one; ``docs/performance.md`` has what the client's path costs the
fan-out, the projector and the connects.)

Callers write a call once, on :class:`StoreCalls` (:func:`store_calls`), which makes that
choice once, by topology: the bare connection where the topology allows one (a single
server over plain TCP or a Unix socket), the client otherwise (a cluster, TLS, a Sentinel
master, the embedded store); either way the reply has one shape (RESP's). A call never
goes both ways: the bare connection fails as the client does, with the client's policy
(:func:`reconnecting`: a lost connection tried again on a fresh one, with the pauses of
the client's reconnecting retry; the client's breaker, :mod:`.breaker`; the client's
exceptions for error replies).
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
from ..retry import doubling_pause, retry
from .breaker import StoreAway, StoreBreaker, breaker_of
from .client import (
    RECONNECT_FIRST_PAUSE,
    RECONNECT_MAX_PAUSE,
    RECONNECT_RETRIES,
    Store,
    commands,
)
from .raw import CONNECT_TIMEOUT, RawConnection, bare_options, open_raw, reply_timeout

T = TypeVar("T")


def direct_calls(redis: Store, encoding: str | None = "utf-8") -> DirectCalls | None:
    """A :class:`DirectCalls` for a single Redis server over plain TCP or a Unix socket;
    None for the others (a cluster, TLS, the embedded store), which keep the client's path.
    ``encoding``: how the replies' strings are decoded (None: they stay bytes)."""
    options = bare_options(redis)
    if options is None:
        return None
    calls = DirectCalls(options, encoding)
    calls.breaker = breaker_of(redis)
    return calls


class DirectCalls:
    """Commands on a connection of this object's own."""

    def __init__(self, options: dict[str, Any], encoding: str | None = "utf-8") -> None:
        self._options = options
        self._encoding = encoding
        self._connection: RawConnection | None = None
        self._connecting = asyncio.Lock()
        self.timeout = reply_timeout(options)
        """Seconds a call waits for its reply (then it fails)."""
        self.breaker: StoreBreaker | None = None
        """While it says the store is away, calls fail at once (see :mod:`.breaker`)."""

    async def call(self, *command: Any, deadline: float | None = None) -> Any:
        """The reply to ``command``. Raises redis-py's errors: an error reply's (as the
        client raises it), ``ConnectionError`` or ``TimeoutError``.

        ``deadline`` (the event loop's time): opening a connection (if none is open) and
        the reply share it; without one, each has its own timeout."""
        if self.breaker is not None and self.breaker.away:
            raise self.breaker.error()
        connection = self._connection
        if connection is None or connection.lost:
            connection = await self._connect(deadline)
        return await connection.call(*command, deadline=deadline)

    def calls(self, *commands: tuple[Any, ...], shared: bool = False) -> Awaitable[list[Any]]:
        """The replies to several commands sent together (see :meth:`call`); ``shared``:
        reads whose replies may be shared (see :class:`~.raw.RawConnection`).

        On an open connection, its own coroutine (no frame around it on the read each
        connect's ``session/resume`` makes); the breaker's error is raised at the call."""
        if self.breaker is not None and self.breaker.away:
            raise self.breaker.error()
        connection = self._connection
        if connection is None or connection.lost:
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
        connection = self._connection
        if connection is None or connection.lost or (self.breaker and self.breaker.away):
            return None
        return connection, connection.request(*command)

    async def send(self, packed: bytes, count: int, wait: float = 0.0) -> list[Any]:
        """The replies to ``count`` commands packed already (see :meth:`RawConnection.send`)."""
        if self.breaker is not None and self.breaker.away:
            raise self.breaker.error()
        connection = self._connection
        if connection is None or connection.lost:
            connection = await self._connect()
        return await connection.send(packed, count, wait)

    async def _connect(self, deadline: float | None = None) -> RawConnection:
        """The open connection, or a new one, by ``deadline`` (the event loop's time;
        default: :data:`~.raw.CONNECT_TIMEOUT` from now), waiting for another caller's
        open included; else redis-py's ``ConnectionError``."""
        loop = asyncio.get_running_loop()
        due = loop.time() + CONNECT_TIMEOUT if deadline is None else deadline
        try:
            async with asyncio.timeout_at(due):
                await self._connecting.acquire()
        except TimeoutError:
            raise RedisConnectionError("could not connect: another open still waits") from None
        try:
            connection = self._connection
            if connection is None or connection.lost:
                connection = self._connection = await open_raw(
                    self._options, self._encoding, timeout=due - loop.time()
                )
            return connection
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
        if self._connection is not None:
            self._connection.close()


def store_calls(redis: Store, *, bare: bool = True, encoding: str | None = "utf-8") -> StoreCalls:
    """:class:`StoreCalls` on ``redis``; ``bare``: on a bare connection where the topology
    allows one (else always through the client)."""
    return StoreCalls(redis, direct_calls(redis, encoding) if bare else None)


RECONNECT_PAUSES = tuple(
    doubling_pause(failures, RECONNECT_FIRST_PAUSE, RECONNECT_MAX_PAUSE)
    for failures in range(1, RECONNECT_RETRIES + 1)
)
"""The pauses before a call is made again on a fresh bare connection: the client's
reconnecting retry's (:func:`~.client.connect`), the same policy on either path."""


async def reconnecting(call: Callable[[], Awaitable[T]], deadline: float | None = None) -> T:
    """``await call()`` (a call on a bare connection), made again on a fresh connection
    after a lost one, as redis-py's reconnecting retry does for the client's commands: only
    a lost connection (a timeout may hide a command that did run), at most
    :data:`~.client.RECONNECT_RETRIES` times, not while the breaker refuses commands, and
    not once ``deadline`` (the event loop's time) has passed."""
    loop = asyncio.get_running_loop()

    def keep(exc: BaseException) -> bool:
        if isinstance(exc, StoreAway):
            return False
        return deadline is None or loop.time() < deadline

    return await retry(call, RECONNECT_PAUSES, errors=(RedisConnectionError,), keep=keep)


class StoreCalls:
    """Commands whose callers write them once, in the shape RESP gives their replies: on a
    bare connection (:class:`DirectCalls`) where there is one (a single server over plain
    TCP or a Unix socket), else through the client. One path per topology, never both for
    a call: the bare connection's failures are its own (a lost connection tried again on a
    fresh one, with the client's reconnecting pauses; a stalled server, an error reply or
    the breaker's refusal raised as the client raises them). The client's replies are put
    back in RESP's shape (:func:`as_resp`)."""

    def __init__(self, redis: Store, direct: DirectCalls | None) -> None:
        self.redis = commands(redis)
        self.direct = direct
        """The bare connection's calls; None where the client carries every call."""

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
        bare connection (the script loaded there first if the server does not know it: a
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
    """``reply`` as a bare connection reads it: redis-py's reply callbacks undone for the
    commands read through :class:`StoreCalls` whose shape they change (a hash's fields and
    values as one flat list, a stream entry's too)."""
    kind = name.upper()
    if kind == "HGETALL" and isinstance(reply, dict):
        return [x for pair in reply.items() for x in pair]
    if kind in ("XRANGE", "XREVRANGE") and isinstance(reply, list):
        return [[i, [x for pair in (f or {}).items() for x in pair]] for i, f in reply]
    return reply
