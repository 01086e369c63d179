"""An idle broker on a Redis Cluster costs its Redis little: the projector waits for the
change feeds' bells instead of polling 256 feeds, and no command's keys are asked of the
server (``COMMAND GETKEYS``). Counted by the masters themselves (``INFO commandstats``);
the figures are ``python -m bench idle --cluster``'s (docs/redis.md)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from broker.serve import Broker
from broker.store import groups
from broker.store.client import connect
from broker.store.log import SessionLog, new_session_id

from .conftest import make_settings
from .support.client import RawClient, wait_for
from .support.commandstats import calls_between, command_calls

CREATED = {"type": "created", "cwd": "/idle", "agent": "demo", "kind": "shell"}
WINDOW = 3.0
"""Seconds of idleness counted."""
BOUND = 600
"""Commands the masters may run in :data:`WINDOW`, all roles together: generous (an idle
broker sends about 60 a second, and a look for abandoned notices or a trim of the feeds,
256 or 512 commands, may fall in the window); before the bells it was some 9,000."""


async def _window(masters: list[int], seconds: float) -> Counter[str]:
    before = await asyncio.to_thread(command_calls, masters)
    await asyncio.sleep(seconds)  # the measurement itself: what idleness costs in it
    after = await asyncio.to_thread(command_calls, masters)
    return calls_between(before, after, len(masters))


async def _settled(masters: list[int]) -> None:
    """Wait (bounded) until start-up's own commands are done: a quiet second."""
    for _ in range(20):
        if sum((await _window(masters, 1.0)).values()) < BOUND / 3:
            return
    raise AssertionError("the broker never went quiet")


async def test_an_idle_broker_sends_few_commands_and_a_new_session_is_listed_after_it(
    redis_cluster_info: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a bell the projector would poll only after this long: a session listed
    # within the wait below was found because its bell rang.
    monkeypatch.setattr(groups, "SAFETY", 600.0)
    masters = redis_cluster_info.masters()
    node = Broker(make_settings(redis_url=redis_cluster_info.url))
    await node.start()
    try:
        await _settled(masters)
        made = await _window(masters, WINDOW)
        assert made["command|getkeys"] == 0, made
        assert sum(made.values()) < BOUND, made
        assert made["xreadgroup"] < 2 * 256, made  # the feeds polled at most once or twice
        # Logged by another process's appender (as an agent host's would be): only the
        # projector can list it.
        store = connect(redis_cluster_info.url)
        session_id = new_session_id()
        await SessionLog(store).create("default", session_id, CREATED)
        await store.aclose()
        client = await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp")

        async def listed() -> bool:
            reply = await client.call("session/list", {})
            sessions = reply.get("result", {}).get("sessions", [])  # an error: not yet
            return session_id in [s["sessionId"] for s in sessions]

        await wait_for(listed, what="the session listed")
        await client.close()
        assert (await _window(masters, 0.5))["command|getkeys"] == 0
    finally:
        await node.stop()
