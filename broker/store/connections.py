"""The connections of the store's own client of one server (:mod:`.own_client`): its pool.

Every command goes on one of them, each a :class:`~.raw.RawConnection`:

* a **shared** connection per reply encoding (strings decoded, or left as bytes), on which
  every command that does not block goes: calls overlap, Redis answers them in order, and
  a transaction is one write of ``MULTI`` … ``EXEC`` (nothing can come between);
* a **held** connection for a command that blocks (a stream read with ``BLOCK``, ``WAIT``)
  while it waits, taken from the idle ones or opened, at most :data:`~.client.POOL_SIZE`
  at once (past that, a caller waits up to :data:`~.client.POOL_WAIT` seconds);
* a **dedicated** connection for a caller that keeps one (a subscription, a consumer's
  blocking reads): opened here, closed by its owner.

One breaker gates them all (:mod:`.breaker`): while it says the store is away, nothing is
sent and nothing waits for a connection; when it opens, the shared and held connections
are cut, so that the calls waiting on a stalled server fail at once with its error rather
than after their reply timeout. One retry policy: :func:`~.direct.reconnecting`, in the
callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError

from ..retry import doubling_pause, retry
from .breaker import StoreAway, StoreBreaker
from .raw import RawConnection, open_raw, reply_timeout

T = TypeVar("T")
R = TypeVar("R", bound=RawConnection)
UTF8 = "utf-8"

RECONNECT_RETRIES = 2
"""A command whose connection turns out dead (the server restarted since it was last used) is
sent again on a fresh connection, at most this many times, after a short backoff."""
RECONNECT_FIRST_PAUSE = 0.1
RECONNECT_MAX_PAUSE = 0.5
"""Seconds of the reconnecting retry's first pause, and at most (they double)."""
RECONNECT_PAUSES = tuple(
    doubling_pause(failures, RECONNECT_FIRST_PAUSE, RECONNECT_MAX_PAUSE)
    for failures in range(1, RECONNECT_RETRIES + 1)
)
"""The pauses before a call is made again on a fresh connection: the same on every
topology (redis-py's client is given them too, :func:`~.client.connect`)."""


async def reconnecting(call: Callable[[], Awaitable[T]], deadline: float | None = None) -> T:
    """``await call()`` (a call on the own client's connections), made again on a fresh
    connection after a lost one, as redis-py's reconnecting retry does for its client's
    commands: only a lost connection (a timeout may hide a command that did run), at most
    :data:`RECONNECT_RETRIES` times, not while the breaker refuses commands, and not once
    ``deadline`` (the event loop's time) has passed."""
    loop = asyncio.get_running_loop()

    def keep(exc: BaseException) -> bool:
        if isinstance(exc, StoreAway):
            return False
        return deadline is None or loop.time() < deadline

    return await retry(call, RECONNECT_PAUSES, errors=(RedisConnectionError,), keep=keep)


class ServerConnections:
    """The pool of the own client of the server ``options`` name (redis-py's connection
    options: host and port or a Unix path, credentials, database, timeouts)."""

    def __init__(
        self, options: dict[str, Any], breaker: StoreBreaker, size: int, wait: float
    ) -> None:
        self.options = options
        self.breaker = breaker
        self.timeout = reply_timeout(options)
        """Seconds a call waits for its reply (then the connection is given up)."""
        self.connect_timeout = float(options.get("socket_connect_timeout") or self.timeout)
        self._wait = wait
        self._shared: dict[str | None, RawConnection] = {}
        self._opening: dict[str | None, asyncio.Lock] = {}
        self._idle: list[RawConnection] = []
        self._held: set[RawConnection] = set()
        self._slots = asyncio.BoundedSemaphore(size)
        self._closed = False
        breaker.on_open(self.cut)

    def check(self) -> None:
        """Raise the breaker's error while the store is away (the probe's own commands
        pass)."""
        if self.breaker.away:
            self.breaker.check()

    def open_shared(self, encoding: str | None = UTF8) -> RawConnection | None:
        """The shared connection of ``encoding`` if it is open now (else None: :meth:`shared`
        opens one)."""
        connection = self._shared.get(encoding)
        if connection is None or connection.lost:
            return None
        return connection

    async def shared(
        self, encoding: str | None = UTF8, deadline: float | None = None
    ) -> RawConnection:
        """The shared connection of ``encoding``, opened (by ``deadline``, the event
        loop's time) if none is open; raises redis-py's ``ConnectionError`` when it cannot
        be had in time, the breaker's error while away."""
        self.check()
        connection = self._shared.get(encoding)
        if connection is not None and not connection.lost:
            return connection
        loop = asyncio.get_running_loop()
        due = loop.time() + self.connect_timeout if deadline is None else deadline
        lock = self._opening.setdefault(encoding, asyncio.Lock())
        try:
            async with asyncio.timeout_at(due):
                await lock.acquire()
        except TimeoutError:
            raise RedisConnectionError("could not connect: another open still waits") from None
        try:
            connection = self._shared.get(encoding)
            if connection is None or connection.lost:
                connection = await self.dedicated(encoding, due - loop.time())
                self._shared[encoding] = connection
            return connection
        finally:
            lock.release()

    async def dedicated(
        self,
        encoding: str | None = UTF8,
        timeout: float | None = None,
        *,
        kind: type[R] = RawConnection,  # type: ignore[assignment]  # the default is an R
    ) -> R:
        """A new connection (of class ``kind``), the caller's to keep and close; its opening
        is given up as soon as the breaker opens (its error raised)."""
        self.check()
        if self._closed:
            raise RedisConnectionError("the client is closed")
        wait = self.connect_timeout if timeout is None else timeout
        opening = open_raw(self.options, encoding, timeout=wait, kind=kind)
        return await self.breaker.unless_away(opening)

    @asynccontextmanager
    async def held(self, encoding: str | None = UTF8) -> AsyncIterator[RawConnection]:
        """A connection of the caller's own while it blocks, given back afterwards (closed if
        it was lost or the call did not end cleanly: a reply may still be due on it)."""
        self.check()
        try:
            await self.breaker.unless_away(asyncio.wait_for(self._slots.acquire(), self._wait))
        except TimeoutError:
            raise RedisConnectionError(
                f"no free connection to the store within {self._wait:g} s"
            ) from None
        connection: RawConnection | None = None
        clean = False
        try:
            while self._idle and connection is None:
                candidate = self._idle.pop()
                connection = None if candidate.lost else candidate
            if connection is None or connection.encoding != encoding:
                if connection is not None:
                    connection.close()
                connection = await self.dedicated(encoding)
            self._held.add(connection)
            yield connection
            clean = True
        finally:
            if connection is not None:
                self._held.discard(connection)
                if clean and not connection.lost and not self._closed:
                    self._idle.append(connection)
                else:
                    connection.close()
            self._slots.release()

    def cut(self) -> None:
        """Close the shared and held connections (the breaker opened): their callers fail
        now, and try again (or fail fast) as the breaker says."""
        for connection in [*self._shared.values(), *self._held, *self._idle]:
            connection.close()
        self._idle.clear()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._shared.clear()
        self.breaker.off_open(self.cut)
