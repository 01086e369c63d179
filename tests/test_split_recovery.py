"""Redis killed under a deployment whose roles run apart (two fronts, an agent host and a
projector as separate processes), restarted with its data (AOF) or empty: new work is served
again within 5 s of Redis accepting connections (10 s when it came back empty), and the
sessions that survived take prompts with their permission round trip, through either front."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from broker.store.client import connect
from broker.store.leases import Leases
from broker.store.log import SessionLog, new_session_id

from .support.client import RawClient, wait_for
from .support.redis_server import RestartableRedis, restartable_redis
from .test_scale_out import cluster_of

pytestmark = pytest.mark.slow

ATTEMPT = 30.0
"""Seconds one probing ``session/new`` may take before the probe asks again (a user would)."""


async def first_new_session_after(url: str, since: float, bound: float) -> float:
    """Seconds from ``since`` (``time.monotonic``) until a ``session/new`` sent through the
    front at ``url`` was answered with a session; asked again every :data:`ATTEMPT` s."""
    while time.monotonic() - since < bound:
        try:
            client = await RawClient.initialized(url)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.1)
            continue
        try:
            reply = await client.call("session/new", {"cwd": "/probe", "mcpServers": []}, ATTEMPT)
            if "result" in reply:
                return time.monotonic() - since
            await asyncio.sleep(0.1)  # an error answered: the store is still coming back
        except TimeoutError:
            pass
        finally:
            await client.close()
    raise AssertionError(f"no session/new answered within {bound} s of Redis returning")


async def prompt_with_permission(client: RawClient, session_id: str, msg_id: str) -> Any:
    """A prompt whose tool call asks the client's permission (granted): its reply."""
    await client.send_prompt(msg_id, session_id, "read")
    while True:
        message = await client.recv(30)
        if message.get("id") == msg_id and "method" not in message:
            return message
        if message.get("method") == "session/request_permission":
            option = message["params"]["options"][0]["optionId"]
            outcome = {"outcome": {"outcome": "selected", "optionId": option}}
            await client.send({"jsonrpc": "2.0", "id": message["id"], "result": outcome})
        else:
            client.inbox.append(message)


def _gone(log_path: Path) -> str:
    """The host's log lines saying a session is gone from the store."""
    lines = log_path.read_text().splitlines()
    return "\n".join(line for line in lines if "gone from the store" in line)


async def test_a_lease_whose_session_vanished_is_told_from_one_held_elsewhere(
    redis_url: str,
) -> None:
    store: Any = connect(redis_url)  # KEYS, beyond the Store protocol: Redis emptied by hand
    try:
        ids = [new_session_id() for _ in range(3)]
        created = {"type": "created", "cwd": "/v", "agent": "demo", "kind": "combined"}
        for sid in ids:
            await SessionLog(store).create("default", sid, created)
        mine, theirs = Leases(store, "host-a", ttl=30), Leases(store, "host-b", ttl=30)
        for sid in ids[:2]:
            await mine.acquire("default", sid)
        await theirs.acquire("default", ids[2])
        await store.delete(*(await store.keys(f"*{ids[0]}*")))  # as Redis restarted empty
        held = [("default", sid) for sid in ids]
        assert await mine.renew(held) == [held[0], held[2]]
        assert mine.vanished == {ids[0]}
    finally:
        await store.aclose()


async def _restart_and_measure(redis: RestartableRedis, url: str, *, empty: bool) -> float:
    redis.kill()
    if empty:
        redis.wipe()
    await asyncio.to_thread(redis.start)  # returns once it accepts connections
    return await first_new_session_after(url, time.monotonic(), 30)


@pytest.mark.parametrize("empty", [False, True], ids=["aof", "empty"])
async def test_roles_apart_serve_new_work_soon_after_redis_returns(
    empty: bool, tmp_path: Path
) -> None:
    with restartable_redis(aof=True) as redis:
        async with cluster_of(redis.url, tmp_path, fronts=2, hosts=1) as deployment:
            clients = [await RawClient.initialized(node.url) for node in deployment.nodes]
            sessions = [await client.new_session("/s") for client in clients for _ in range(2)]
            for i, session_id in enumerate(sessions):
                reply = await prompt_with_permission(clients[i // 2], session_id, f"before-{i}")
                assert reply.get("result", {}).get("stopReason") == "end_turn", reply
            took = await _restart_and_measure(redis, deployment.nodes[1].url, empty=empty)
            print(f"{'empty' if empty else 'AOF'} restart: session/new answered {took:.1f} s after")
            assert took < (10.0 if empty else 5.0)
            if empty:
                # Every session vanished with the data, and no other host runs: said so.
                host_log = deployment.hosts[0].log_path
                await wait_for(
                    lambda: all(sid in _gone(host_log) for sid in sessions), 10, "gone sessions"
                )
                assert "another host runs it now" not in host_log.read_text()
                return
            for i, session_id in enumerate(sessions):  # each through its own front
                reply = await prompt_with_permission(clients[i // 2], session_id, f"after-{i}")
                assert reply.get("result", {}).get("stopReason") == "end_turn", reply
            for client in clients:
                await client.close()
