"""While Redis is known to be away, requests fail fast; the first after it returns is served.

A real ``acp-broker serve`` on a redis-server that the test stops with SIGSTOP (a stall:
connections stay open, nothing is answered). Once the broker's probe has noticed (about
``PROBE_TIMEOUT`` seconds), every request that needs the store is answered within a second
with a clear "try again" error. Once Redis answers again, the breaker closes and requests
are served normally.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker.store.breaker import PROBE_TIMEOUT

from .support.broker_process import broker_process
from .support.client import RawClient, text
from .support.redis_server import restartable_redis
from .test_redis_faults import ENV, SLACK, _readyz

pytestmark = pytest.mark.slow

FAST = 1.0
"""Seconds within which a request is answered while the store is known to be away."""


async def _timed(client: RawClient, method: str, params: dict[str, object]) -> tuple[float, dict]:
    started = time.monotonic()
    reply = await client.call(method, params, timeout=30)
    return time.monotonic() - started, reply


async def test_requests_fail_fast_while_redis_is_stalled_and_are_served_once_back(
    tmp_path: Path,
) -> None:
    with restartable_redis(aof=False) as redis:
        async with broker_process(redis.url, log_path=tmp_path / "broker.log", env=ENV) as node:
            client = await RawClient.initialized(node.url)
            reply = await client.call("session/new", {"cwd": "/ff", "mcpServers": []}, 30)
            session_id = reply["result"]["sessionId"]
            _, listed = await _timed(client, "session/list", {})
            assert session_id in [s["sessionId"] for s in listed["result"]["sessions"]]

            redis.pause()
            try:
                # The probe notices within PROBE_TIMEOUT (+ its interval): from then on,
                # every request needing the store is answered at once.
                started = time.monotonic()
                while True:
                    took, reply = await _timed(
                        client, "session/new", {"cwd": "/ff", "mcpServers": []}
                    )
                    assert "error" in reply, reply
                    if took <= FAST:
                        break
                    assert time.monotonic() - started < PROBE_TIMEOUT + 5 + SLACK
                for _ in range(10):
                    took, reply = await _timed(
                        client, "session/new", {"cwd": "/ff", "mcpServers": []}
                    )
                    assert took <= FAST + 0.5, took  # a loaded machine's slack
                    assert "try again" in reply["error"]["message"], reply
                    assert "internal error" not in reply["error"]["message"]
                    took, reply = await _timed(
                        client,
                        "session/prompt",
                        {"sessionId": session_id, "prompt": text("/notool")},
                    )
                    assert took <= FAST + 0.5 and "try again" in reply["error"]["message"], reply
                    took, listed = await _timed(client, "session/list", {})
                    assert took <= FAST + 0.5, took
                    # The page cache empties itself when its watch stops hearing Redis (it
                    # cannot tell what changed meanwhile): a list fails fast too.
                    assert "result" in listed or "try again" in listed["error"]["message"]
            finally:
                redis.resume()

            async def store_back() -> bool:
                _, report = await _readyz(node)
                return bool(report["checks"]["redis"]["ok"])

            deadline = time.monotonic() + 10
            while not await store_back():
                assert time.monotonic() < deadline, "the store check never passed again"
            # The first request after the store is back is served normally.
            reply = await client.call("session/new", {"cwd": "/back", "mcpServers": []}, 30)
            assert "result" in reply, reply
            reply = await client.call(
                "session/prompt",
                {"sessionId": reply["result"]["sessionId"], "prompt": text("/notool")},
                30,
            )
            assert reply["result"]["stopReason"] == "end_turn", reply
            await client.close()
