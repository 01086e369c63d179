"""Redis fails under a running broker, and every role recovers by itself.

A real ``acp-broker serve`` process (front, agent host and projector) on a redis-server of
the test's own, which the test kills with SIGKILL and restarts with its data (the
append-only file), restarts empty, or stops with SIGSTOP for 20 s. Throughout, every request
is answered or failed within its deadline, no prompt hangs, and no update the agent sent
is lost: a client watching a streaming prompt sees every chunk once, in order.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.store.client import commands, connect
from broker.store.keys import CAPABILITIES_KEY
from workers.agent_host.worker import HostWorker

from .conftest import make_settings
from .support.broker_process import BrokerProcess, broker_process
from .support.client import RawClient, text
from .support.outage import get_json
from .support.redis_server import RestartableRedis, restartable_redis

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT = 5.0
ENV = {
    "ACP_BROKER_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT),
    "ACP_BROKER_REDIS_TIMEOUT": "2",
    "ACP_BROKER_LEASE_TTL": "5",
}
SLACK = 3.0
"""Seconds past a deadline that an answer may take to cross the machine (2 shared cores)."""


async def _new_session(url: str, cwd: str) -> tuple[RawClient, str]:
    client = await RawClient.initialized(url)
    reply = await client.call("session/new", {"cwd": cwd, "mcpServers": []}, timeout=30)
    assert "result" in reply, reply
    return client, reply["result"]["sessionId"]


async def _start_prompt(client: RawClient, session_id: str, prompt: str) -> str:
    prompt_id = f"prompt-{time.monotonic_ns()}"
    await client.send_prompt(prompt_id, session_id, prompt)
    return prompt_id


async def _until(check: Callable[[], Awaitable[bool]], timeout: float) -> float:
    """Try ``check`` until it holds; the seconds it took (fails past ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if await check():
                return time.monotonic() - started
        except (OSError, TimeoutError, AssertionError):
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"not recovered within {timeout} s")


async def _readyz(node: BrokerProcess) -> tuple[int, Any]:
    return await asyncio.to_thread(get_json, f"http://127.0.0.1:{node.port}/readyz")


async def _works(node: BrokerProcess) -> bool:
    """A new session takes a prompt (with its permission round trip): service is back."""
    client = await RawClient.connect(node.url)
    try:
        await client.initialize()
        reply = await client.call(
            "session/new", {"cwd": "/probe", "mcpServers": []}, timeout=REQUEST_TIMEOUT + SLACK
        )
        if "result" not in reply:
            return False
        session_id = reply["result"]["sessionId"]
        reply = await client.call(
            "session/prompt", {"sessionId": session_id, "prompt": text("/notool")}, timeout=15
        )
        return reply.get("result", {}).get("stopReason") == "end_turn"
    finally:
        await client.close()


async def _stream_through(
    redis: RestartableRedis, node: BrokerProcess, fault: Callable[[], Awaitable[None]]
) -> tuple[RawClient, str, dict[str, Any]]:
    """A prompt streams 60 chunks while ``fault`` happens; returns its client and reply."""
    client, session_id = await _new_session(node.url, "/stream")
    prompt_id = await _start_prompt(client, session_id, "/slow 60")
    await client.read_chunks(session_id, 5, 20)
    await fault()
    reply = await client.reply_to(prompt_id, timeout=90)
    return client, session_id, reply


async def test_redis_killed_and_restarted_with_its_data_loses_nothing(tmp_path: Path) -> None:
    with restartable_redis(aof=True) as redis:
        async with broker_process(redis.url, log_path=tmp_path / "broker.log", env=ENV) as node:
            recovery: list[float] = []

            async def crash_and_restart() -> None:
                redis.kill()
                await asyncio.sleep(1.0)
                await asyncio.to_thread(redis.start)
                recovery.append(await _until(lambda: _works(node), 30))

            client, session_id, reply = await _stream_through(redis, node, crash_and_restart)
            assert reply.get("result", {}).get("stopReason") == "end_turn", reply
            expected = [f"chunk {i}" for i in range(1, 61)]
            await client.read_chunks(session_id, 60, 20)
            assert client.chunks(session_id) == expected
            # The log holds every chunk once: a fresh connection's load replays them.
            viewer = await RawClient.initialized(node.url)
            loaded = await viewer.call(
                "session/load", {"sessionId": session_id, "cwd": "/stream", "mcpServers": []}
            )
            assert "result" in loaded, loaded
            assert viewer.chunks(session_id) == expected
            print(f"AOF restart: a new session took a prompt {recovery[0]:.1f} s after")


async def test_redis_restarted_empty_serves_new_sessions_without_restarting_a_role(
    tmp_path: Path,
) -> None:
    with restartable_redis(aof=False) as redis:
        async with broker_process(redis.url, log_path=tmp_path / "broker.log", env=ENV) as node:
            client, session_id = await _new_session(node.url, "/before")
            redis.kill()
            redis.wipe()
            await asyncio.to_thread(redis.start)
            took = await _until(lambda: _works(node), 30)
            print(f"empty restart: a new session took a prompt {took:.1f} s after")
            # The session that vanished with the data gets a clear error, not a hang.
            reply = await client.call(
                "session/prompt",
                {"sessionId": session_id, "prompt": text("hello")},
                timeout=REQUEST_TIMEOUT + 40,
            )
            assert "error" in reply, reply
            listed = await client.call("session/list", {}, timeout=REQUEST_TIMEOUT + SLACK)
            assert "result" in listed, listed
            log = node.log_text()
            assert "NOGROUP" not in log or log.count("NOGROUP") < 5, log[-3000:]


async def test_a_stalled_redis_fails_requests_in_time_and_drops_no_update(
    tmp_path: Path,
) -> None:
    with restartable_redis(aof=False) as redis:
        async with broker_process(redis.url, log_path=tmp_path / "broker.log", env=ENV) as node:
            lister = await RawClient.initialized(node.url)
            waits: list[float] = []
            answers: list[str] = []
            recovery: list[float] = []

            async def stall() -> None:
                redis.pause()
                try:
                    # Health tells the truth: not ready while Redis does not answer.
                    started = time.monotonic()
                    status, report = await _readyz(node)
                    assert status == 503 and not report["checks"]["redis"]["ok"], report
                    assert time.monotonic() - started < 2 + SLACK
                    stop = time.monotonic() + 20
                    while time.monotonic() < stop:
                        started = time.monotonic()
                        reply = await lister.call(
                            "session/list", {}, timeout=REQUEST_TIMEOUT + SLACK
                        )
                        waits.append(time.monotonic() - started)
                        answers.append("result" if "result" in reply else "error")
                        await asyncio.sleep(0.5)
                finally:
                    redis.resume()
                recovery.append(await _until(lambda: _works(node), 30))

            client, session_id, reply = await _stream_through(redis, node, stall)
            assert answers and max(waits) <= REQUEST_TIMEOUT + SLACK, (waits, answers)
            assert "error" in answers, answers  # the store did not answer: they said so
            assert reply.get("result", {}).get("stopReason") == "end_turn", reply
            await client.read_chunks(session_id, 60, 20)
            assert client.chunks(session_id) == [f"chunk {i}" for i in range(1, 61)]

            async def ready() -> bool:
                return (await _readyz(node))[0] == 200

            # The pub/sub check turns healthy once a probe is heard again (every 2 s).
            ready_after = await _until(ready, 15)
            print(f"stall: a new session took a prompt {recovery[0]:.1f} s after SIGCONT")
            print(f"stall: /readyz healthy {ready_after:.1f} s after that")
            print(f"stall: session/list waits {[round(w, 1) for w in waits]}, {answers}")


def _attempts_of_hset(store: Any) -> list[int]:
    """Counts the store's HSET calls (in ``[0]``), each still made."""
    attempts = [0]
    hset = store.hset

    def counted(*args: Any, **kwargs: Any) -> Any:
        attempts[0] += 1
        return hset(*args, **kwargs)

    store.hset = counted
    return attempts


async def test_an_agents_capabilities_are_published_once_redis_is_back() -> None:
    with restartable_redis(aof=False) as server:
        store = connect(server.url, timeout=1.0)
        worker = HostWorker(store, make_settings(answer_timeout=30))
        attempts = _attempts_of_hset(store)
        server.kill()
        publishing = asyncio.create_task(
            worker._publish_capabilities("demo", {"loadSession": True})
        )

        async def failed_once() -> bool:
            return attempts[0] >= 2

        await _until(failed_once, timeout=15)
        server.start()
        await asyncio.wait_for(publishing, 30)
        assert json.loads(await commands(store).hget(CAPABILITIES_KEY, "demo")) == {
            "loadSession": True
        }
        await store.aclose()


async def test_capabilities_never_published_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with restartable_redis(aof=False) as server:
        store = connect(server.url, timeout=1.0)
        worker = HostWorker(store, make_settings(answer_timeout=0.5))
        server.kill()
        await asyncio.wait_for(worker._publish_capabilities("demo", {}), 15)
        assert "could not publish agent demo's capabilities" in caplog.text
        await store.aclose()
