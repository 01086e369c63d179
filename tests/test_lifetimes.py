"""A role's loops (:class:`broker.lifetimes.RoleLoops`): run in one task group, a failing
one logged and restarted with growing pauses while readiness says so, all stopped together."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from broker.lifetimes import FIRST_PAUSE, RoleLoops
from broker.ops.health import Unhealthy

from .support.client import wait_for


async def test_a_failing_loop_is_logged_and_restarted_with_growing_pauses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    starts: list[float] = []
    steady = asyncio.Event()

    async def flaky() -> None:
        starts.append(time.monotonic())
        if len(starts) < 4:
            raise RuntimeError(f"fault {len(starts)}")
        steady.set()
        await asyncio.Event().wait()

    async def calm() -> None:
        await asyncio.Event().wait()

    loops = RoleLoops("test role")
    loops.add("flaky", flaky)
    loops.add("calm", calm)
    async with loops:
        await asyncio.wait_for(steady.wait(), 10)
        pauses = [b - a for a, b in itertools.pairwise(starts)]
        assert pauses[0] >= FIRST_PAUSE * 0.9 and pauses[2] >= pauses[0] * 3, pauses
        with pytest.raises(Unhealthy, match="flaky failed \\(RuntimeError: fault 3\\)"):
            await loops.check()  # restarted, not yet stable
        assert all(not task.done() for task in loops.tasks())
        failures = [r for r in caplog.records if "loop flaky failed" in r.getMessage()]
        assert len(failures) == 3 and all(r.exc_info for r in failures)
    assert all(task.done() for task in loops.tasks())
    assert loops.problem() == "stopped"


async def test_a_loop_that_ends_is_a_failure_too_and_a_stop_cancels_every_loop() -> None:
    ended = 0
    cancelled: list[str] = []

    async def short() -> None:
        nonlocal ended
        ended += 1

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("forever")
            raise

    loops = RoleLoops("test role")
    loops.add("short", short)
    loops.add("forever", forever)
    with pytest.raises(Unhealthy, match="not started"):
        await loops.check()
    await loops.start()
    await wait_for(lambda: ended >= 2, 5)
    assert "short failed (it ended)" in (loops.problem() or "")
    await loops.stop()
    assert cancelled == ["forever"]
    with pytest.raises(RuntimeError):
        loops.add("late", short)


async def test_a_loop_restarted_on_purpose_starts_again_at_once_and_is_no_failure() -> None:
    runs: list[int] = []
    closed: list[int] = []

    async def reader() -> None:
        runs.append(len(runs))
        try:
            await asyncio.Event().wait()
        finally:
            closed.append(runs[-1])

    loops = RoleLoops("test role")
    loops.add("reader", reader)
    async with loops:
        await wait_for(lambda: len(runs) == 1, 5)
        loops.restart("reader")
        loops.restart("reader")  # asked twice before it ended: one restart
        await wait_for(lambda: len(runs) == 2, 5)
        assert closed == [0] and loops.problem() is None
        [task] = loops.tasks()
        assert not task.done()
    assert closed == [0, 1]
