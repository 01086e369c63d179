"""The agent host's prompt queue alone: FIFO wake-ups, withdrawal by the author only, late
cancels logged, a let-go session failing what waits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.protocol.jsonrpc import RpcError
from broker.store.events import EventType, Position
from workers.agent_host import queue
from workers.agent_host.sessions import HeldSession

from .support.client import wait_for


class Recorder:
    """Logs appended events in memory, seq by seq."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def append(self, held: Any, body: dict[str, Any]) -> Position:
        self.events.append(body)
        return Position(len(self.events), "e1")


def _held() -> tuple[HeldSession, Any]:
    """A held session (no agent: the queue never asks one) and its in-memory recorder."""
    agent: Any = None
    return HeldSession("t1", "s1", agent=agent, agent_session_id="a1"), Recorder()


async def test_queued_prompts_wake_in_order_and_only_their_author_withdraws() -> None:
    held, recorder = _held()
    held.prompt_task = asyncio.current_task()  # a turn runs
    enters = [
        asyncio.ensure_future(
            queue.enter(held, recorder, f"p{i}", "conn", {"prompt": []}, author=f"alice{i % 2}")
        )
        for i in range(3)
    ]
    await wait_for(lambda: len(recorder.events) == 3, what="the three prompts logged, waiting")
    assert [e["promptId"] for e in recorder.events] == ["p0", "p1", "p2"]
    assert queue.busy(held)
    # Bob may not withdraw alice1's prompt: a logged no-op, and it still waits.
    await queue.withdraw(held, recorder, "p1", "bob")
    assert recorder.events[-1] == {
        "type": EventType.CANCEL_IGNORED,
        "activityId": "p1",
        "reason": "not_author",
    }
    await queue.withdraw(held, recorder, "p1", "alice1")
    withdrawn = await enters[1]
    assert withdrawn.turn.result() == Position(len(recorder.events), "e1")
    assert recorder.events[-1]["type"] == EventType.PROMPT_WITHDRAWN
    # The running turn ends: the first waiting prompt's turn comes, then the next's.
    held.prompt_task = None
    queue.wake_next(held)
    first = await enters[0]
    assert first.prompt_id == "p0" and not enters[2].done()
    held.queue.remove(first)
    queue.wake_next(held)
    assert (await enters[2]).prompt_id == "p2"
    # A cancel of what is not waiting (it ended, or never was): logged, nothing else.
    await queue.withdraw(held, recorder, "p0", "alice0")
    assert recorder.events[-1] == {"type": EventType.CANCEL_IGNORED, "activityId": "p0"}


async def test_a_let_go_session_fails_what_waits() -> None:
    held, recorder = _held()
    held.prompt_task = asyncio.current_task()
    waiting = asyncio.ensure_future(queue.enter(held, recorder, "p", "c", {}))
    await wait_for(lambda: recorder.events, what="the prompt logged, waiting")
    queue.fail_all(held, RpcError(-32600, "deleted"))
    with pytest.raises(RpcError):
        await waiting
    assert held.queue == []
