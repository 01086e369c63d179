"""The lifetime of a role's loops: run in one task group, restarted with backoff when one
fails, stopped together, and never failing silently.

Every role (a front's parts, an agent host, a projector) runs a few loops for as long as
it runs: reading its commands, renewing leases, projecting feeds, trimming streams. A loop
that raised out once (a bug, a reply of a shape it did not expect) used to end its task
unseen: the role went on without it, and only a readiness check that happened to look at
that task could tell. A :class:`RoleLoops` owns them instead::

    loops = RoleLoops("agent host")
    loops.add("host-inbox", self._read_inbox)
    async with loops:                  # each loop a task of one asyncio.TaskGroup
        ...                            # a loop that fails: logged, restarted with backoff
    # leaving the block cancels every loop and waits for them

A loop that raises (or returns: a loop's end is a failure too) is logged with its
traceback and started again after a pause that doubles from :data:`FIRST_PAUSE` to
:data:`MAX_PAUSE`; meanwhile, and until it has run :data:`STABLE` seconds without failing,
the role's readiness check (:meth:`RoleLoops.check`) fails naming it. A loop that runs
:data:`STABLE` seconds starts again from the first pause at its next failure.

A role may also start one of its loops over on purpose (:meth:`RoleLoops.restart`: a
subscription found deaf is read afresh): that run is cancelled and the loop started again
at once, which is no failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .errors.failures import describe
from .loops import cancel_and_wait
from .ops.health import Unhealthy
from .retry import doubling_pause

log = logging.getLogger(__name__)

FIRST_PAUSE = 0.1
"""Seconds before a failed loop is started again the first time."""
MAX_PAUSE = 10.0
"""The longest pause between two starts of a loop that keeps failing."""
STABLE = 10.0
"""Seconds a restarted loop runs before its role is ready again (and its pause reset)."""

Loop = Callable[[], Coroutine[Any, Any, None]]


class RoleLoops:
    """The loops of one role, supervised in one task group (see the module)."""

    def __init__(self, role: str) -> None:
        self.role = role
        self._loops: dict[str, Loop] = {}
        self._group: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._failed: dict[str, tuple[float, str]] = {}
        """Loops that failed: when they last started again, and the failure."""
        self._running: dict[str, asyncio.Task[None]] = {}
        """The loops running now (not pausing after a failure), by name."""
        self._restarting: set[str] = set()

    def add(self, name: str, loop: Loop) -> None:
        """Run ``loop()`` (a coroutine that runs until cancelled) as ``name`` once started."""
        if self._group is not None:
            raise RuntimeError(f"{self.role}: loop {name} added after its loops started")
        self._loops[name] = loop

    def restart(self, name: str) -> None:
        """Start loop ``name`` over: its run is cancelled (its ``finally`` blocks run) and
        it is started again at once. A loop that is not running (pausing after a failure,
        or not started) is left to start in its time."""
        task = self._running.get(name)
        if task is not None and name not in self._restarting:
            self._restarting.add(name)
            task.cancel()

    @property
    def names(self) -> list[str]:
        return list(self._loops)

    async def start(self) -> None:
        """Start every loop, in one task group run by a task of its own."""
        if self._group is None:
            self._group = asyncio.create_task(self._run(), name=f"{self.role} loops")

    async def stop(self) -> None:
        """Cancel every loop and wait until each has ended.

        Each loop's task is cancelled itself, again until it ends (see
        :func:`~broker.loops.cancel_and_wait`): a task group cancels its tasks once, and a
        cancellation that redis-py took for its own timeout would leave a loop that retries
        on errors running, and the stop waiting for it for ever."""
        self._stopping = True
        if self._group is not None:
            await cancel_and_wait(*self._tasks)
            await cancel_and_wait(self._group)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The loops' tasks (each runs its loop again and again: see the module)."""
        return list(self._tasks)

    async def __aenter__(self) -> RoleLoops:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def running(self) -> bool:
        """Whether the loops run (started, not stopped, none failing)."""
        return self.problem() is None

    def problem(self) -> str | None:
        """What keeps the role's loops from running as they should; None when they do."""
        if self._group is None:
            return "not started"
        if self._group.done():
            return "stopped"
        now = time.monotonic()
        failing = [
            f"{name} failed ({reason}), restarted"
            for name, (since, reason) in self._failed.items()
            if now - since < STABLE
        ]
        return "; ".join(failing) or None

    async def check(self) -> str | None:
        """The role's readiness check: :class:`Unhealthy` saying which loop fails."""
        problem = self.problem()
        if problem is not None:
            raise Unhealthy(f"{self.role}: {problem}")
        return None

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._tasks = [
                group.create_task(self._supervised(name, loop), name=name)
                for name, loop in self._loops.items()
            ]

    async def _supervised(self, name: str, loop: Loop) -> None:
        """Run ``loop`` until cancelled, starting it again after each failure."""
        failures = 0
        while True:
            started = time.monotonic()
            failure: BaseException | None = None
            task = asyncio.current_task()
            assert task is not None
            self._running[name] = task
            try:
                await loop()
            except asyncio.CancelledError as exc:
                if self._stopping or task.uncancel() > 0:
                    raise
                if name in self._restarting:  # restart(): started again at once
                    self._restarting.discard(name)
                    continue
                failure = exc  # cancelled by another hand than the role's stop: restarted
            except Exception as exc:
                failure = exc
            finally:
                self._running.pop(name, None)
            if time.monotonic() - started >= STABLE:
                failures = 0  # it ran well for a while: a new failure, not the same
            failures += 1
            pause = doubling_pause(failures, FIRST_PAUSE, MAX_PAUSE)
            reason = "it ended" if failure is None else describe(failure) or "cancelled"
            log.error(
                "%s: loop %s failed (%s); restarting it in %.1f s",
                self.role,
                name,
                reason,
                pause,
                exc_info=failure,
            )
            self._failed[name] = (time.monotonic() + pause, reason)
            await asyncio.sleep(pause)
