"""A Redis Cluster behind the store's breaker: while no master answers, requests fail fast
with "try again" (cached list pages are still answered); once one answers, they are served.

On the test's real 3-master cluster (with replicas); the end-to-end test runs a real
``acp-broker serve`` and stops every master with SIGSTOP (a stall: connections stay open,
nothing is answered; the replicas cannot take over without a majority of masters).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.store.breaker import INTERVAL, PROBE_TIMEOUT, StoreAway, breaker_of
from broker.store.client import commands, connect

from .support.broker_process import broker_process
from .support.client import RawClient, text
from .support.outage import (
    kept_by_the_cache,
    listed_ids,
    metrics_page,
    rest_list,
    served_again,
    timed,
)
from .support.redis_server import free_port
from .test_redis_faults import SLACK, _readyz

pytestmark = pytest.mark.slow

ENV = {"ACP_BROKER_LEASE_TTL": "5"}
"""The default ``redis_timeout`` (5 s): what a request waited for without the breaker."""

BOUND = 3.0
"""Seconds within which a request is answered once the breaker is open (loose: the
machine is shared; it takes milliseconds)."""


async def _store_away(http_port: int) -> bool:
    """Whether the front's ``/metrics`` says its breaker is open."""
    return "\nacp_broker_store_away 1.0\n" in await metrics_page(http_port)


async def test_a_cluster_client_fails_at_once_while_its_breaker_is_open(
    redis_cluster_info: Any,
) -> None:
    store = connect(redis_cluster_info.url)
    breaker = breaker_of(store)
    assert breaker is not None and not breaker.away
    try:
        assert await commands(store).set("k", "v")
        script = commands(store).register_script("return redis.call('GET', KEYS[1])")
        assert await script(keys=["k"]) == "v"
        breaker.open(RedisConnectionError("probe failed"))
        with pytest.raises(StoreAway, match="failing fast"):
            await commands(store).get("k")
        with pytest.raises(StoreAway):
            await script(keys=["k"])
        with pytest.raises(StoreAway):
            async with commands(store).pipeline(transaction=False) as pipe:
                pipe.set("k", "other")
                await pipe.execute()
        pubsub = commands(store).pubsub()
        with pytest.raises(StoreAway):  # through the node's gated connection
            await pubsub.ssubscribe("acpb:test:channel")
        await pubsub.aclose()
        breaker.close()
        assert await commands(store).get("k") == "v"  # nothing refused ran
        async with commands(store).pipeline(transaction=False) as pipe:
            pipe.get("k")
            assert await pipe.execute() == ["v"]
    finally:
        breaker.close()
        await store.aclose()


async def test_requests_fail_fast_while_every_master_is_stalled_and_are_served_once_back(
    redis_cluster_info: Any, tmp_path: Path
) -> None:
    cluster = redis_cluster_info
    http_port = free_port()
    async with broker_process(
        cluster.url,
        log_path=tmp_path / "broker.log",
        env=ENV,
        extra_args=["--http-port", str(http_port)],
    ) as node:
        client = await RawClient.initialized(node.url)
        reply = await client.call("session/new", {"cwd": "/cb", "mcpServers": []}, 30)
        session_id = reply["result"]["sessionId"]
        await kept_by_the_cache(client, http_port, cluster.url, session_id)

        masters = cluster.masters()
        for port in masters:
            cluster.pause(port)
        try:
            # A request already waiting on a master when they stalled fails at its own
            # timeout (``redis_timeout``), with the same clear error.
            stalled = time.monotonic()
            waiting = asyncio.create_task(
                timed(client, "session/new", {"cwd": "/cb", "mcpServers": []})
            )
            # The probe notices within two PROBE_TIMEOUTs (+ its interval).
            while not await _store_away(http_port):
                assert time.monotonic() - stalled < 2 * PROBE_TIMEOUT + INTERVAL + SLACK
                await asyncio.sleep(0.05)
            print(f"breaker open {time.monotonic() - stalled:.1f} s after the masters stalled")
            took, reply = await waiting
            print(f"the request in flight then was answered after {took:.1f} s")
            assert "try again" in reply["error"]["message"], reply
            other = await RawClient.initialized(node.url)  # no store needed to connect
            took_all: list[float] = []
            for _ in range(5):
                for asking in (client, other):
                    took, reply = await timed(
                        asking, "session/new", {"cwd": "/cb", "mcpServers": []}
                    )
                    took_all.append(took)
                    assert took < BOUND and "try again" in reply["error"]["message"], (took, reply)
                    assert "internal error" not in reply["error"]["message"]
                took, reply = await timed(
                    client, "session/prompt", {"sessionId": session_id, "prompt": text("/notool")}
                )
                took_all.append(took)
                assert took < BOUND and "try again" in reply["error"]["message"], (took, reply)
                took, listed = await timed(client, "session/list", {})  # cached: answered
                took_all.append(took)
                assert took < BOUND and session_id in listed_ids(listed), (took, listed)
                took, listed = await timed(client, "session/list", {"cwd": "/other"})
                took_all.append(took)
                assert took < BOUND and "try again" in listed["error"]["message"], (took, listed)
            print(f"{len(took_all)} requests then, the slowest answered in {max(took_all):.3f} s")
            await other.close()
            status, rest = await rest_list(http_port)
            assert status == 200 and session_id in [s["id"] for s in rest["data"]], rest
        finally:
            for port in masters:
                cluster.resume(port)

        async def store_back() -> bool:
            _, report = await _readyz(node)
            return bool(report["checks"]["redis"]["ok"])

        deadline = time.monotonic() + 30
        while not await store_back():
            assert time.monotonic() < deadline, "the store check never passed again"
            await asyncio.sleep(0.2)
        await served_again(client, session_id)  # without a restart
        await client.close()
