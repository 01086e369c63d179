"""Bare connections to one Redis server: hiredis packs and parses, asyncio carries.

On one Redis server over plain TCP or a Unix socket these are the store's only
connections: :mod:`.own_client` sends every command on them. Anything else (TLS, a
Sentinel master, a cluster, the embedded store) is redis-py's throughout.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..compat.redis import error_from_reply

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0


def reply_timeout(options: dict[str, Any]) -> float:
    """Seconds a connection to the server ``options`` name waits for a reply: the
    client's own ``socket_timeout``."""
    return float(options.get("socket_timeout") or CONNECT_TIMEOUT)


def command(*args: Any) -> bytes:
    """A command in RESP (hiredis's stubs take a one-element tuple; any length works). A
    name of two words (``"SCRIPT LOAD"``, as redis-py's command builders name some) is two
    arguments, as redis-py packs it."""
    name = args[0]
    if type(name) is str and " " in name:
        args = (*name.split(), *args[1:])
    return hiredis.pack_command(cast(Any, args))


def handshake(options: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The commands a new connection sends first, each answered ``OK``: AUTH, SELECT."""
    commands: list[tuple[Any, ...]] = []
    password = options.get("password")
    if password:
        username = options.get("username")
        commands.append(("AUTH", username, password) if username else ("AUTH", password))
    if int(options.get("db") or 0):
        commands.append(("SELECT", int(options["db"])))
    return commands


class RawConnection(asyncio.Protocol):
    """Commands and their replies on one connection, pipelined: calls may overlap, and
    Redis answers them in order. A reply whose caller stopped waiting is dropped.

    Reads marked ``shared`` go out at the end of the event loop's step, together with
    whatever else is asked in it, in one write: a node's clients reconnecting here at once
    each read their session (``session/resume``), and a write each was a system call per
    client (with the read of its reply, ~8% of a front's CPU while 10,000 connect). A shared
    read that is the very same command as one waiting for that write is not sent again: the
    one reply answers them all (read after every one of them was asked). Any other command
    is written at once when nothing waits for the step's write (a page or a replay read
    waits no extra turn of the loop: +10-20 us on a session/list p50, ``bench list``), and
    joins that write otherwise, so that replies come in the order they are awaited."""

    def __init__(self, encoding: str | None = "utf-8") -> None:
        # ``encoding`` None: strings come as bytes (a page sent on as it was read).
        self.encoding = encoding
        self._reader = hiredis.Reader(encoding=encoding) if encoding else hiredis.Reader()
        # A reply's waiter: one future, or a shared read's list of them (one per caller).
        self._waiting: collections.deque[asyncio.Future[Any] | list[asyncio.Future[Any]]] = (
            collections.deque()
        )
        self._out: list[bytes] = []  # commands to write at the end of this step
        self._shared: dict[bytes, list[list[asyncio.Future[Any]]]] = {}  # of those, by bytes
        self._transport: asyncio.Transport | None = None
        # :meth:`request`'s futures and when each is due, in the order sent (so, due): one
        # timer watches the oldest, not a timer each.
        self._watched: collections.deque[tuple[float, asyncio.Future[Any]]] = collections.deque()
        self._watchdog: asyncio.TimerHandle | None = None
        self._in_step: dict[asyncio.Future[Any], Callable[[asyncio.Future[Any]], None]] = {}
        self.lost = False
        self.timeout: float = CONNECT_TIMEOUT
        """Seconds a call waits for its reply before the connection is given up."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        # Held: on Python 3.11 each lookup of the running loop is a getpid() system call.
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        in_step = self._in_step
        try:
            while (reply := self._reader.gets()) is not False:
                waiter = self._waiting.popleft()
                if type(waiter) is list:
                    for future in waiter:
                        if not future.done():
                            future.set_result(reply)
                    continue
                future = cast("asyncio.Future[Any]", waiter)
                done = in_step.pop(future, None) if in_step else None
                if future.done():
                    continue
                if done is None:
                    future.set_result(reply)
                else:
                    _run_in_step(future, reply, done)
        except (hiredis.ProtocolError, IndexError):  # not Redis, or a reply nobody asked for
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._out.clear()
        self._shared.clear()
        self._in_step.clear()  # their futures fail below: their callbacks run as any
        self._watched.clear()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        while self._waiting:
            waiter = self._waiting.popleft()
            for future in waiter if isinstance(waiter, list) else (waiter,):
                if not future.done():
                    future.set_exception(RedisConnectionError(f"connection lost: {exc}"))

    async def call(self, *args: Any, deadline: float | None = None) -> Any:
        """The reply to one command; an error reply raises ``ResponseError``, a lost
        connection redis-py's ``ConnectionError``, no reply by ``deadline`` (the event
        loop's time; default: :attr:`timeout` from now) redis-py's ``TimeoutError``."""
        if self.lost or self._transport is None:
            raise RedisConnectionError("connection lost")
        now = self._loop.time()
        due = now + self.timeout if deadline is None else deadline
        (future,) = self._queue(command(*args), 1, shared=False)
        # A timer that fails the reply's future, not asyncio.timeout (which cancels the
        # task, and looks the loop up three times).
        timer = self._loop.call_at(due, _expire, future)
        try:
            reply = await future
        except _Stalled:
            raise self._stalled(max(due - now, 0.0)) from None
        finally:
            timer.cancel()
        return _checked(reply)

    def request(self, *args: Any) -> asyncio.Future[Any]:
        """:meth:`call` for a caller that cannot await (one answering in a callback, with no
        task of its own): the future of the reply, to be read with :meth:`result` once done.
        Bounded as :meth:`call` is: failed after :attr:`timeout` (by one timer for all of
        them, armed for the oldest: a timer each, and its cancelling callback, were an extra
        turn of the event loop per ``session/list``); cancelling it drops the reply."""
        if self.lost or self._transport is None:
            raise RedisConnectionError("connection lost")
        loop = self._loop
        (future,) = self._queue(command(*args), 1, shared=False)
        due = loop.time() + self.timeout
        self._watched.append((due, future))
        if self._watchdog is None:
            self._watchdog = loop.call_at(due, self._watch)
        return future

    def in_step(self, future: asyncio.Future[Any], done: Callable[[Any], None]) -> None:
        """Have ``done``, a done callback of :meth:`request`'s ``future``, run in the step
        that reads the reply, as soon as it is read, rather than scheduled for the event
        loop's next turn (its other ways to end, failed or cancelled, schedule it as ever).
        A ``session/list`` miss is answered so without an extra turn of the loop: a poll
        of the sockets (``epoll_wait``) and a callback a request, in the uncached front's
        ``strace -c`` 3 polls a request where the bare server beside it (``bench list``'s
        ``redis_ws``) had 2."""
        if not future.done():
            self._in_step[future] = done

    def result(self, future: asyncio.Future[Any]) -> Any:
        """The reply a :meth:`request`'s future (done, not cancelled) brought; raises as
        :meth:`call` does."""
        watched = self._watched
        while watched and watched[0][1].done():  # answered in order: no longer watched
            watched.popleft()
        try:
            reply = future.result()
        except _Stalled:
            raise self._stalled() from None
        return _checked(reply)

    def _watch(self) -> None:
        """The watchdog's turn: fail the requests past due (the oldest waits longest), and
        arm it for the oldest still waiting."""
        self._watchdog = None
        watched = self._watched
        now = self._loop.time()
        while watched and (watched[0][1].done() or watched[0][0] <= now):
            _expire(watched.popleft()[1])
        if watched:
            self._watchdog = self._loop.call_at(watched[0][0], self._watch)

    async def calls(self, *commands: tuple[Any, ...], shared: bool = False) -> list[Any]:
        """The replies to several commands, sent together (a pipeline, not a transaction);
        raises as :meth:`call` does, for the first error reply. ``shared``: they only read,
        and their replies may be another caller's too (see the class), so they must not be
        changed."""
        packed = b"".join([command(*c) for c in commands])
        return await self.send(packed, len(commands), shared=shared)

    async def send(
        self, packed: bytes, count: int, wait: float = 0.0, *, shared: bool = False
    ) -> list[Any]:
        """:meth:`calls` for ``count`` commands packed already (a command made again and
        again, such as a read of 256 streams, is packed once); ``wait`` is how much longer
        than :attr:`timeout` they may take (a blocking read among them)."""
        return [_checked(reply) for reply in await self.replies(packed, count, wait, shared=shared)]

    async def replies(
        self, packed: bytes, count: int, wait: float = 0.0, *, shared: bool = False
    ) -> list[Any]:
        """:meth:`send`'s replies as they came, error replies among them (hiredis's
        ``ReplyError``): a pipeline's caller decides what each error means."""
        if self.lost or self._transport is None:
            raise RedisConnectionError("connection lost")
        loop = self._loop
        futures = self._queue(packed, count, shared=shared)
        timer = loop.call_at(loop.time() + self.timeout + wait, _expire, *futures)
        try:
            return [await future for future in futures]  # answered in order
        except _Stalled:
            raise self._stalled(self.timeout + wait) from None
        finally:
            timer.cancel()
            _settle(futures)

    def _queue(self, packed: bytes, count: int, *, shared: bool) -> list[asyncio.Future[Any]]:
        """The futures of ``count`` replies to ``packed``: written now, or in this step's
        write, or (a shared read) answered by the same read already waiting for it."""
        loop = self._loop
        futures = [loop.create_future() for _ in range(count)]
        if not shared and not self._out:
            self._waiting.extend(futures)
            self._transport.write(packed)  # type: ignore[union-attr]  # callers checked it
            return futures
        waiters = self._shared.get(packed) if shared else None
        if waiters is not None:
            for waiter, future in zip(waiters, futures, strict=True):
                waiter.append(future)
            return futures
        if not self._out:
            loop.call_soon(self._flush)
        self._out.append(packed)
        if shared:
            waiters = self._shared[packed] = [[future] for future in futures]
            self._waiting.extend(waiters)
        else:
            self._waiting.extend(futures)
        return futures

    def _flush(self) -> None:
        """Write the commands of this step, in the order their replies are awaited."""
        out = self._out
        if not out:  # lost meanwhile: their callers were failed
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._shared.clear()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _stalled(self, waited: float | None = None) -> RedisTimeoutError:
        """A stalled server: the calls behind this one would wait as long. The connection
        is given up; the next call opens another (or fails to, in bounded time)."""
        self.close()
        return RedisTimeoutError(
            f"no reply within {self.timeout if waited is None else waited:g} s"
        )

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _Stalled(Exception):
    """No reply within the connection's timeout."""


def _expire(*futures: asyncio.Future[Any]) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(_Stalled())


def _run_in_step(
    future: asyncio.Future[Any], reply: Any, done: Callable[[asyncio.Future[Any]], None]
) -> None:
    """``future``'s result set, and its done callback ``done`` run now, not scheduled."""
    future.remove_done_callback(done)
    future.set_result(reply)
    try:
        done(future)
    except Exception:  # logged as the loop logs a done callback's error; the replies after go on
        log.exception("a reply's callback failed")


def _settle(futures: list[asyncio.Future[Any]]) -> None:
    """After a wait for ``futures`` ended, the way ``asyncio.gather`` leaves them: any still
    pending cancelled (its reply is then dropped), any failure retrieved (not logged)."""
    for future in futures:
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()


def _checked(reply: Any) -> Any:
    """A reply as it is, or for an error reply the error redis-py's client raises for it
    (``ReadOnlyError``, ``NoScriptError``, ``OutOfMemoryError`` … or ``ResponseError``)."""
    if isinstance(reply, hiredis.ReplyError):
        raise error_from_reply(str(reply))
    return reply


R = TypeVar("R", bound=RawConnection)


async def open_raw(
    options: dict[str, Any],
    encoding: str | None = "utf-8",
    *,
    timeout: float = CONNECT_TIMEOUT,
    kind: type[R] = RawConnection,  # type: ignore[assignment]  # the default is an R
) -> R:
    """A :class:`RawConnection` to the server ``options`` name, authenticated, its database
    selected; raises redis-py's ``ConnectionError`` when it cannot be had within ``timeout``
    seconds (connect and handshake together: a caller with a deadline of its own passes
    what is left of it). ``encoding``: how its replies' strings are decoded (None: left as
    bytes)."""
    loop = asyncio.get_running_loop()
    raw: R | None = None
    made = functools.partial(kind, encoding)
    try:
        async with asyncio.timeout(timeout):
            if options.get("path"):
                _, raw = await loop.create_unix_connection(made, options["path"])
            else:
                host, port = options.get("host", "localhost"), int(options.get("port", 6379))
                _, raw = await loop.create_connection(made, host, port)
            raw.timeout = reply_timeout(options)
            for step in handshake(options):
                await raw.call(*step)
    except BaseException as exc:
        if raw is not None:  # half open (cancelled too): not left to the garbage collector
            raw.close()
        if isinstance(exc, OSError | TimeoutError | RedisError):
            raise RedisConnectionError(f"could not connect to {_address(options)}: {exc}") from exc
        raise
    return raw


def _address(options: dict[str, Any]) -> str:
    """Where ``options`` point: ``host:port`` or the Unix socket's path."""
    if options.get("path"):
        return str(options["path"])
    return f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"
