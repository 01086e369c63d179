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

Cyclic garbage among frozen objects would never be found that way, so every ``interval``
seconds everything is unfrozen and one full collection runs over the whole heap, its
survivors frozen again: such garbage lives at most that long. A closed connection leaves
none (its cycles are broken when it closes, ``front/acp/websocket_only.py``): churning 400
connections (``initialize``, ``session/resume``, ``session/list``, an unknown method),
the sweep after found no object in a cycle; before that, 660 (freezing only what full
collections left) and 5,172 (this policy: 12.9 objects a connection).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

SWEEP_INTERVAL = 600.0
"""Seconds between two full collections over the whole heap. A sweep stops everything
else: on a front with 19,488 connections it held a fan-out beside them for ~0.9 s
(``bench c50k``: p99 807 ms where the same fan-out alone had 16 ms), so it comes once
in ten minutes, not every minute."""


class FreezeSurvivors:
    """Freezes what each collection but the youngest leaves; sweeps the whole heap every
    ``interval``."""

    def __init__(self, interval: float = SWEEP_INTERVAL) -> None:
        self.interval = interval
        self.sweeps = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Freeze what start-up made, and from now on what each collection of the middle and
        the oldest generation leaves."""
        gc.freeze()
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sweep_every())

    async def stop(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    def _on_collection(phase: str, info: dict[str, Any]) -> None:
        # Called by the collector when a collection has ended: what survived one of the
        # middle generation (or a full one) now sits in the oldest; freezing it is a list
        # splice (no objects are walked).
        if phase == "stop" and info.get("generation", 0) >= 1:
            gc.freeze()

    async def _sweep_every(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sweep()

    def sweep(self) -> None:
        """One full collection over everything (frozen objects included), then its
        survivors frozen again."""
        gc.unfreeze()
        gc.collect()  # its callback freezes the survivors
        gc.freeze()
        self.sweeps += 1
