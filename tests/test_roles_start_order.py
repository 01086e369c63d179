"""A ``session/new`` sent before any agent host runs is answered once one is up.

Real processes as Compose and Kubernetes start them: two front-only nodes
(``serve --no-workers``) on a real redis-server, and an agent host and a projector
(``acp-broker worker``) started after a client's ``session/new`` was sent (0.3 s, 2 s and
5 s later), or every role started at once. The fronts start faster than hosts, so the
command sits in the shared queue before the first host creates the queue's consumer group:
it must be run as soon as the host reads the queue, not after the front's 30 s deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from .support.broker_process import broker_process
from .support.client import RawClient, text
from .support.redis_server import redis_server
from .support.roles import role_process

pytestmark = pytest.mark.slow

ANSWERED_AFTER_HOST = 10.0
"""Seconds within which the command is answered once the host says it is ready (the host
reads its queue at once; the slack is a loaded machine's: the demo agent's start)."""


async def _started_late(redis_url: str, tmp_path: Path, delay: float | None) -> None:
    async with contextlib.AsyncExitStack() as stack:
        hosts_at_once = delay is None
        if hosts_at_once:  # every role at once: the fronts' starts race the host's
            host_started = asyncio.ensure_future(
                stack.enter_async_context(
                    role_process("agent-host", redis_url, tmp_path / "host.log")
                )
            )
            projector_started = asyncio.ensure_future(
                stack.enter_async_context(
                    role_process("projector", redis_url, tmp_path / "projector.log")
                )
            )
        fronts = [
            await stack.enter_async_context(
                broker_process(
                    redis_url, log_path=tmp_path / f"front{i}.log", extra_args=["--no-workers"]
                )
            )
            for i in range(2)
        ]
        client = await RawClient.initialized(fronts[1].url)
        stack.push_async_callback(client.close)
        asked = asyncio.ensure_future(
            client.call("session/new", {"cwd": "/order", "mcpServers": []}, 40)
        )
        if delay is None:
            await asyncio.gather(host_started, projector_started)
        else:
            await asyncio.sleep(delay)  # the scenario: the fronts run, the host not yet
            await asyncio.gather(
                stack.enter_async_context(
                    role_process("agent-host", redis_url, tmp_path / "host.log")
                ),
                stack.enter_async_context(
                    role_process("projector", redis_url, tmp_path / "projector.log")
                ),
            )
        host_ready = time.monotonic()
        reply = await asyncio.wait_for(asked, ANSWERED_AFTER_HOST + 30)
        took = time.monotonic() - host_ready
        assert "result" in reply, (delay, reply)
        assert took <= ANSWERED_AFTER_HOST, (delay, took)
        session_id = reply["result"]["sessionId"]
        reply = await client.call(
            "session/prompt", {"sessionId": session_id, "prompt": text("/notool")}, 30
        )
        assert reply["result"]["stopReason"] == "end_turn", reply


@pytest.mark.parametrize("delay", [0.3, 2.0, 5.0, None], ids=["0.3s", "2s", "5s", "together"])
async def test_a_session_new_sent_before_the_host_runs_is_answered_once_it_is_up(
    tmp_path: Path, delay: float | None
) -> None:
    with redis_server() as redis_url:  # its own: the first host creates the queue's group
        await _started_late(redis_url, tmp_path, delay)
