"""Garbage collection in a server process: a full collection walks only what is new.

CPython runs a full collection whenever the objects that survived the younger ones since
the last full collection reach a quarter of those that survived it. A front whose clients
arrive in a burst (a node's clients reconnecting here at once) grows its long-lived heap
from next to nothing to a million objects in seconds, and every full collection on the way
walks all of it: while 10,000 clients connected to a front, 7 full collections (and the
younger ones) took 1.0 s of its 5.5 s of CPU (``gc.callbacks``, ``bench connections``).
What survives them is what the connections hold, as long as they stay.

:class:`FreezeSurvivors` freezes what survives each collection of the middle generation
(and each full one): ``gc.freeze``, the collector no longer looks at it. An object that
has outlived two young collections is the state of a connection or a session, which lives
for minutes or hours; a full collection then has nothing to walk. Freezing only the
survivors of full collections (issue 19a) still left each of those walking everything
made since the one before: at 19,488 connections the first after the clients had joined
walked 233,567 objects in 157 ms, a stall of the fan-out beside them (``bench c50k``).

Cyclic garbage among frozen objects would never be found that way; a sweep (everything
unfrozen, one full collection over the whole heap, its survivors frozen again) finds it,
but holds everything else for as long as it walks: ~0.9 s at 10,000 idle connections here
(an in-process front: 786,517 frozen objects, 0.86-1.05 s a sweep; 0.9 s at 19,488 in
``bench c50k``). A sweep every 10 minutes stopped every client of a front that often.

A closed connection leaves nothing in a cycle (``front/acp/websocket_only.py``; a test
churns 2,000 connections, ended in five ways and refused in two, with the collector off),
so garbage has no steady source: a sweep now comes only once the heap per open connection
(``sys.getallocatedblocks()``: 0.6 ms at 1.6 million blocks, where counting the frozen
objects took 143) has grown to :data:`SWEEP_GROWTH` times what the last sweep left. Clients
joining make the heap grow with the connections, not per connection, and never set one
off; what garbage can pile up before one comes is as much as the heap held then.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SWEEP_GROWTH = 2.0
"""A sweep comes once the heap per open connection is this many times what the last left."""
CONNECTION_FLOOR = 100
"""Added to the open connections in the heap per connection: with few connections (or a
process without a front) it is the heap's growth that counts."""
CHECK_INTERVAL = 10.0
"""Seconds between two looks at the heap (one ``sys.getallocatedblocks()``: under 1 ms)."""


class FreezeSurvivors:
    """Freezes what each collection but the youngest leaves; sweeps the whole heap once the
    heap per connection has grown by :data:`SWEEP_GROWTH` since the last sweep."""

    def __init__(
        self,
        connections: Callable[[], int] = lambda: 0,
        growth: float = SWEEP_GROWTH,
        check_every: float = CHECK_INTERVAL,
    ) -> None:
        self.connections = connections
        self.growth = growth
        self.check_every = check_every
        self.sweeps = 0
        self._left = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Freeze what start-up made, and from now on what each collection of the middle and
        the oldest generation leaves."""
        gc.freeze()
        self._left = self.heap_per_connection()
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sweep_when_due())

    async def stop(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def heap_per_connection(self) -> float:
        """Allocated memory blocks per open connection (plus :data:`CONNECTION_FLOOR`)."""
        return sys.getallocatedblocks() / (self.connections() + CONNECTION_FLOOR)

    def due(self) -> bool:
        """Whether the heap per connection has grown enough since the last sweep for one."""
        return self.heap_per_connection() >= self.growth * self._left

    @staticmethod
    def _on_collection(phase: str, info: dict[str, Any]) -> None:
        # Called by the collector when a collection has ended: what survived one of the
        # middle generation (or a full one) now sits in the oldest; freezing it is a list
        # splice (no objects are walked).
        if phase == "stop" and info.get("generation", 0) >= 1:
            gc.freeze()

    async def _sweep_when_due(self) -> None:
        while True:
            await asyncio.sleep(self.check_every)
            if self.due():
                self.sweep()

    def sweep(self) -> None:
        """One full collection over everything (frozen objects included), then its
        survivors frozen again."""
        began = time.perf_counter()
        grown = self.heap_per_connection() / self._left if self._left else float("nan")
        gc.unfreeze()
        found = gc.collect()  # its callback freezes the survivors
        gc.freeze()
        self.sweeps += 1
        self._left = self.heap_per_connection()
        log.info(
            "collector: swept the whole heap in %.0f ms (%d objects freed; heap per"
            " connection %.1fx the last sweep's)",
            (time.perf_counter() - began) * 1000,
            found,
            grown,
        )
