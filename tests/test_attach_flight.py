"""A front asks the agent host once for a burst of clients resuming one session alike."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from broker.config import AgentSpec
from broker.front.agents import RemoteAgents
from broker.protocol.commands import Op
from broker.protocol.jsonrpc import RpcError, invalid_params
from broker.store.keys import host_inbox


class _Host:
    """Stands in for ``RemoteAgents._call``: records each command, answers when told."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.called = asyncio.Event()

    async def call(
        self, op: Op, tenant: str, session_id: str | None, fields: Any, **kw: Any
    ) -> Any:
        for bookkeeping in ("holder_only", "watch"):  # see test_lost_commands.py
            kw.pop(bookkeeping, None)
        self.calls.append((op, tenant, session_id, fields, kw))
        self.called.set()
        return await self.answer


def _agents(host: _Host) -> RemoteAgents:
    agents = RemoteAgents(
        cast(Any, None), [AgentSpec(name="demo", command=["x"])], reply_channel="n"
    )
    agents._call = host.call  # type: ignore[method-assign]
    return agents


async def _settled(*tasks: asyncio.Task[Any]) -> None:
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)


async def _asked(host: _Host, calls: int) -> None:
    """Wait (bounded) until the host has been sent ``calls`` commands."""
    async with asyncio.timeout(5):
        while len(host.calls) < calls:
            host.called.clear()
            await host.called.wait()


async def test_clients_resuming_alike_share_one_command_and_one_gets_the_agents_reply() -> None:
    host = _Host()
    agents = _agents(host)
    params: dict[str, Any] = {"mcpServers": []}
    waits = [asyncio.create_task(agents.attach("t", "s1", params, holder="h1")) for _ in range(5)]
    other = asyncio.create_task(agents.attach("t", "s1", {"mcpServers": [{"name": "x"}]}))
    elsewhere = asyncio.create_task(agents.attach("t", "s2", params))
    await _asked(host, 3)
    assert len(host.calls) == 3  # one per session and params
    first = host.calls[0]
    assert first[0] == Op.ATTACH and first[4] == {"first": host_inbox("h1")}
    assert host.calls[2][4] == {"first": None}  # no lease read: where the lease says
    host.answer.set_result({"modes": {"currentModeId": "a"}})
    await _settled(*waits, other, elsewhere)
    assert len(host.calls) == 3  # and none came after the first three
    assert waits[0].result() == {"modes": {"currentModeId": "a"}}
    assert [w.result() for w in waits[1:]] == [{}] * 4
    assert other.result() and elsewhere.result()
    # Once answered, the next client asks afresh.
    host.answer = asyncio.get_running_loop().create_future()
    later = asyncio.create_task(agents.attach("t", "s1", params))
    await _asked(host, 4)
    assert len(host.calls) == 4
    host.answer.set_result({})
    await _settled(later)


async def test_a_client_that_goes_away_does_not_cancel_the_others_wait_and_errors_reach_all() -> (
    None
):
    host = _Host()
    agents = _agents(host)
    params: dict[str, Any] = {"mcpServers": []}
    gone = asyncio.create_task(agents.attach("t", "s1", params))
    stays = asyncio.create_task(agents.attach("t", "s1", params))
    await _asked(host, 1)
    gone.cancel()
    await asyncio.wait([gone], timeout=5)
    assert gone.done() and not stays.done()
    host.answer.set_exception(invalid_params("no such capability"))
    await _settled(gone, stays)
    assert gone.cancelled()
    with pytest.raises(RpcError):
        stays.result()
    assert len(host.calls) == 1
