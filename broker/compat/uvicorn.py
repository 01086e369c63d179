"""uvicorn's internals the broker relies on, in one place: a deadline uvicorn does not set,
and a server that runs inside the broker's loop.

:func:`guarded_h11` subclasses uvicorn's ``H11Protocol`` (not a public API: it overrides
``connection_made``, ``data_received``, ``on_response_complete`` and ``connection_lost``,
and reads ``conn``, ``loop`` and ``transport``); ``tests/test_compat_uvicorn.py`` checks
each of them, so an upgrade that moves one fails there by name. :class:`EmbeddedServer`
overrides ``Server.capture_signals`` and ``Server.main_loop`` and calls ``on_tick``; the same
tests run uvicorn's own server and check that ``serve`` still goes through them.

Deadlines uvicorn does not set: the HTTP listener's request heads and idle sockets.

uvicorn closes a keep-alive connection that stays idle after a response
(``timeout_keep_alive``) but sets no deadline before the first request, nor on a
request head that trickles in a byte at a time: such sockets (slowloris) stay open for
good, and enough of them use up the process's file descriptors, which the WebSocket
listener needs too. :func:`guarded_h11` gives uvicorn's h11 protocol that deadline: a
connection whose request head is not complete ``head_timeout`` seconds after it opened
(or after the last response) is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def guarded_h11(head_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol (``uvicorn.Config(http=…)``), with a deadline on request heads."""

    class GuardedH11Protocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._await_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._await_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_deadline()
            super().connection_lost(exc)

        def _await_head(self) -> None:
            """Start the deadline while a request head is awaited; stop it once one is in."""
            if self.conn.their_state is h11.IDLE:
                if self._head_deadline is None and not self.transport.is_closing():
                    self._head_deadline = self.loop.call_later(head_timeout, self._head_late)
            else:
                self._cancel_deadline()

        def _cancel_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_late(self) -> None:
            self._head_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                log.info("closing an HTTP connection: no request head within %gs", head_timeout)
                self.transport.close()

    return GuardedH11Protocol


class EmbeddedServer(uvicorn.Server):
    """uvicorn inside the broker's loop, stopped by :meth:`exit` rather than by signals.

    uvicorn's own ``main_loop`` wakes every 0.1 s to look at ``should_exit``; this one waits
    on an event, a second at most (each wait is a tick that refreshes the Date header), so a
    stop is at once and an idle listener costs one wake-up a second.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the broker, not uvicorn, handles SIGINT and SIGTERM

    async def main_loop(self) -> None:
        """uvicorn's loop of ticks, ended at once by :meth:`exit`."""
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # every wait is a second: refresh on each tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), 1.0)

    def exit(self) -> None:
        """Stop serving: uvicorn's shutdown (bounded by its graceful timeout) follows."""
        self.should_exit = True
        self._exit.set()
