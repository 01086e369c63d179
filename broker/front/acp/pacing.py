"""Pacing a connection's frames where they are read (see :mod:`.flow`).

A frame's requests wait, before the next frame is read, as long as the connection's
:class:`~.flow.Pace`, the room for requests in flight and the credential's budget ask;
:class:`FramePacer` says how long, and refuses them past ``max_pace``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from ...auth.principal import Principal
from ...config import Settings
from ...protocol import jsonrpc
from ...protocol.jsonrpc import Batch, Invalid, Message, Request, RpcError
from ...store.errors import StoreError
from .access import Access, counted_subject, token_rate_limit
from .flow import Pace


class Paced(Protocol):
    """What pacing reads of a connection."""

    principal: Principal | None
    pace: Pace

    def reading_held(self, held: bool) -> None:
        """Pacing holds (True) or stops holding (False) the connection's reading back."""
        ...


class Budgets(Protocol):
    """Where the limits come from: the settings, and the credentials' shared budgets."""

    settings: Settings
    access: Access


class FramePacer:
    """How long one connection's frames wait before the next one is read.

    The connection's :class:`~.intake.Intake` is built on this class: pacing reads the
    requests in flight and the limits the intake holds, and its own state is two slots of
    the intake's object (an object of its own was 88 bytes an idle connection)."""

    __slots__ = ("_holds", "_room")

    # Held by the intake, read here.
    _owner: Callable[[], Any | None]  # weakly: the connection holds its intake
    _methods: Budgets
    _settings: Settings
    _loop: asyncio.AbstractEventLoop
    inflight: dict[jsonrpc.RequestId, tuple[Request, asyncio.Future[Any]]]

    def __init__(self, holds: bool) -> None:
        self._holds = holds
        """Whether the connection is told when pacing holds its reading back."""
        self._room: asyncio.Future[None] | None = None  # set when a request in flight ends

    @property
    def _conn(self) -> Paced:
        conn: Paced | None = self._owner()
        assert conn is not None  # the connection outlives its parts' work (cancelled at its end)
        return conn

    def room_made(self) -> None:
        """A request in flight ended: a frame waiting for room may go on."""
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    def paced_now(self, message: Message | Invalid | Batch) -> bool:
        """:meth:`_pace` when it would not wait (True: counted in); False: nothing counted."""
        requests = requests_in(message)
        if not requests:
            return True
        if len(self.inflight) + requests > self._settings.max_requests_in_flight:
            return False
        conn = self._owner()  # not :attr:`_conn`: a call less for each message
        assert conn is not None
        pace = conn.pace
        if not pace.take(requests):
            return False
        subject = counted_subject(conn.principal)
        if subject and not self._methods.access.rates.take_leased(subject, requests):
            pace.refund(requests)
            return False
        return True

    async def pace(self, message: Message | Invalid | Batch) -> RpcError | None:
        """Wait as long as the frame's requests need (see :meth:`_pace`), telling the
        connection while that holds its reading back (the keepalive does not count that
        time against a Pong); the error that refuses them, if they get no room."""
        if not self._holds or not requests_in(message):
            return await self._pace(message)
        conn = self._conn
        conn.reading_held(True)
        try:
            return await self._pace(message)
        finally:
            conn.reading_held(False)

    async def _pace(self, message: Message | Invalid | Batch) -> RpcError | None:
        """Wait as long as the frame's requests need (:mod:`.flow`); the error that refuses
        them when the credential's budget has no room within ``max_pace`` seconds."""
        requests = requests_in(message)
        if not requests:
            return None
        loop = self._loop
        deadline = loop.time() + self._settings.max_pace
        if len(self.inflight) + requests > self._settings.max_requests_in_flight:
            await self._room_in_flight(requests, deadline)
        wait = self._conn.pace.spend(requests)
        if wait > 0:
            await asyncio.sleep(wait)
        subject = counted_subject(self._conn.principal)
        if not subject:
            return None
        rates = self._methods.access.rates
        while True:
            try:
                wait = await rates.take(subject, requests)
            except (StoreError, OSError) as exc:  # the store away: served uncounted
                rates.failures.failed(exc)
                return None
            rates.failures.succeeded()
            if not wait:
                return None
            if loop.time() + wait > deadline:
                return token_rate_limit(self._settings)
            await asyncio.sleep(wait)

    async def _room_in_flight(self, requests: int, deadline: float) -> None:
        """Wait (until ``deadline`` at most) for room for ``requests`` more in flight; past it,
        the ones with no room are refused by the intake."""
        limit = self._settings.max_requests_in_flight
        loop = self._loop
        while len(self.inflight) + min(requests, limit) > limit:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._room = loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room, left)


def requests_in(message: Message | Invalid | Batch) -> int:
    """How many requests a frame carries (what its pace counts)."""
    if isinstance(message, Request):  # most frames: no entries to walk
        return 1
    if isinstance(message, Batch):
        return sum(1 for entry in message.entries if isinstance(entry, Request))
    return 0
