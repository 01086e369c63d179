"""A command whose agent host died after acknowledging it, before answering, is sent again.

For a prompt, only while the prompt is not recorded: one that began is ended by the host
that takes the session over.

The test plays the agent hosts against a real Redis: it reads the commands a front's
:class:`RemoteAgents` puts in a host's inbox and answers them as a host would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.config import AgentSpec
from broker.front.agents import RemoteAgents
from broker.protocol import commands
from broker.protocol.commands import PromptOutcome
from broker.protocol.jsonrpc import RpcError
from broker.store.client import Store, connect
from broker.store.client import commands as raw
from broker.store.events import EventType, LogEvent, Position
from broker.store.keys import host_inbox, lease_key
from broker.store.log import SessionLog

CREATED = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Store]:
    client = connect(redis_url)
    await SessionLog(client).create("t", "s", CREATED)
    await raw(client).set(lease_key("t", "s"), "h1")
    yield client
    await client.aclose()


def _front(redis: Store) -> RemoteAgents:
    return RemoteAgents(
        redis, [AgentSpec(name="demo", command=["x"])], reply_channel="node", ack_timeout=0.1
    )


async def _command_in(redis: Store, host: str, after: str = "0") -> tuple[str, dict[str, Any]]:
    """The next command in ``host``'s inbox after entry ``after`` (waits at most 5 s)."""
    reply = await raw(redis).xread({host_inbox(host): after}, count=1, block=5000)
    assert reply, f"no command reached {host}"
    [(_, [(entry_id, fields)])] = reply
    return entry_id, json.loads(fields["m"])


async def test_a_prompt_acknowledged_by_a_host_that_died_unrecorded_runs_on_the_next(
    redis: Store,
) -> None:
    front = _front(redis)
    turn = asyncio.create_task(front.prompt("t", "s", {"prompt": []}, "conn"))
    _, first = await _command_in(redis, "h1")
    front.on_reply(commands.ack(first["rid"], "h1"))
    # h1 dies before it records the prompt; h2 takes the session over.
    await raw(redis).set(lease_key("t", "s"), "h2")
    _, again = await _command_in(redis, "h2")
    assert again["promptId"] == first["promptId"] and again["params"] == first["params"]
    front.on_reply(commands.ack(again["rid"], "h2"))
    outcome = PromptOutcome({"stopReason": "end_turn"}, Position(3, "e"))
    front.on_reply(commands.result(again["rid"], commands.prompt_reply(outcome)))
    assert await asyncio.wait_for(turn, 5) == outcome


async def test_a_recorded_prompt_is_not_sent_again_and_ends_with_its_prompt_end(
    redis: Store,
) -> None:
    front = _front(redis)
    looks = asyncio.Event()
    still_with = front._still_with

    async def counted(tenant: str, session_id: str, host: str, prompt_id: str | None) -> bool:
        answer = await still_with(tenant, session_id, host, prompt_id)
        looks.set()
        return answer

    front._still_with = counted  # type: ignore[method-assign]
    turn = asyncio.create_task(front.prompt("t", "s", {"prompt": []}, "conn"))
    entry, first = await _command_in(redis, "h1")
    front.on_reply(commands.ack(first["rid"], "h1"))
    # h1 recorded the prompt (this node did not see the event) and then died.
    prompt = {"type": EventType.PROMPT, "promptId": first["promptId"], "origin": "conn"}
    await SessionLog(redis).append("t", "s", prompt)
    await raw(redis).set(lease_key("t", "s"), "h2")
    for _ in range(3):  # three looks, each finding the prompt recorded
        looks.clear()
        await asyncio.wait_for(looks.wait(), 5)
    assert await raw(redis).xlen(host_inbox("h2")) == 0
    assert await raw(redis).xread({host_inbox("h1"): entry}) == []
    cut = {"code": -32603, "message": "the agent host running this prompt stopped"}
    end = {"type": EventType.PROMPT_END, "promptId": first["promptId"], "error": cut}
    front.on_event(LogEvent(4, "e", 0, end))
    with pytest.raises(RpcError, match="stopped"):
        await asyncio.wait_for(turn, 5)


async def test_an_attach_acknowledged_by_a_host_that_died_is_answered_by_the_next(
    redis: Store,
) -> None:
    front = _front(redis)
    resume = asyncio.create_task(front.attach("t", "s", {"mcpServers": []}, holder="h1"))
    _, first = await _command_in(redis, "h1")
    front.on_reply(commands.ack(first["rid"], "h1"))
    await raw(redis).set(lease_key("t", "s"), "h2")  # h1 died; h2 took the session over
    _, again = await _command_in(redis, "h2")
    assert again["op"] == "attach" and again["rid"] != first["rid"]
    front.on_reply(commands.result(again["rid"], {"modes": None}))
    assert await asyncio.wait_for(resume, 5) == {"modes": None}
    # The first host's late answer, on its own call, changes nothing.
    front.on_reply(commands.result(first["rid"], {"late": True}))


async def test_a_fault_in_the_watch_fails_the_command_visibly(
    redis: Store, caplog: pytest.LogCaptureFixture
) -> None:
    front = _front(redis)

    async def broken(tenant: str, session_id: str, host: str, prompt_id: str | None) -> bool:
        raise RuntimeError("the watch broke")

    front._still_with = broken  # type: ignore[method-assign]
    resume = asyncio.create_task(front.attach("t", "s", {"mcpServers": []}, holder="h1"))
    _, first = await _command_in(redis, "h1")
    front.on_reply(commands.ack(first["rid"], "h1"))
    with pytest.raises(RuntimeError, match="the watch broke"):
        await asyncio.wait_for(resume, 5)
    assert "watching a command for session s failed" in caplog.text
