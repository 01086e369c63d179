"""within_deadline: what asyncio.timeout does (the work cancelled at the deadline, becoming
DeadlinePassed; a cancellation from outside stays one), on the loop its caller holds."""

from __future__ import annotations

import asyncio

import pytest

from broker.front.deadlines import DeadlinePassed, within_deadline
from broker.protocol.jsonrpc import RpcError
from broker.store.errors import StoreConnectionLost


async def test_work_done_in_time_is_its_result() -> None:
    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    assert await within_deadline(work(), "m", 5.0, asyncio.get_running_loop()) == 7
    assert await within_deadline(work(), "m", 5.0) == 7
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_work_past_its_deadline_is_cancelled_and_fails_with_deadline_passed() -> None:
    cancelled = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cancelled.set()

    with pytest.raises(DeadlinePassed, match=r"m was not answered within 0\.05 s"):
        await within_deadline(work(), "m", 0.05, asyncio.get_running_loop())
    assert cancelled.is_set()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    # The task goes on as before: the next await is not cancelled.
    await asyncio.sleep(0)


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(30)

    task = asyncio.ensure_future(within_deadline(work(), "m", 0.5))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_unreachable_store_is_a_clear_error() -> None:
    async def work() -> None:
        raise StoreConnectionLost("ConnectionError: refused")  # as a port raises it

    with pytest.raises(RpcError, match="the session store is unreachable"):
        await within_deadline(work(), "m", 5.0)
