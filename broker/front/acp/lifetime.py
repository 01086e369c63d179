"""The work tied to one connection's life: cancelled when the connection ends."""

from __future__ import annotations

import asyncio
from typing import Any


class Lifetime:
    """Tasks and reads of one connection, held while they run (a set is made only while
    any runs: 216 bytes an idle connection does not pay)."""

    __slots__ = ("_work", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._work: set[asyncio.Future[Any]] | None = None

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run ``coro`` in a task tied to the connection's life."""
        task = asyncio.ensure_future(coro, loop=self.loop)
        self.keep(task)
        return task

    def keep(self, work: asyncio.Future[Any]) -> None:
        """Tie ``work`` (a task, a read) to the connection's life: cancelled at its end."""
        self.add(work)
        work.add_done_callback(self.done)

    def add(self, work: asyncio.Future[Any]) -> None:
        """:meth:`keep` for work whose own done callback calls :meth:`done`."""
        if self._work is None:
            self._work = set()
        self._work.add(work)

    def done(self, work: asyncio.Future[Any]) -> None:
        """``work`` ended: no longer held."""
        held = self._work
        if held is not None:
            held.discard(work)
            if not held:
                self._work = None

    def cancel_all(self) -> None:
        """The connection ended: cancel everything still running."""
        for work in list(self._work or ()):
            work.cancel()
