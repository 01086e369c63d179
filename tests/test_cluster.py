"""The broker on a real Redis Cluster: 3 masters, sharded pub/sub, a failover under traffic."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker.serve import Broker
from broker.store.client import connect
from broker.store.keys import SessionKeys
from broker.store.log import SessionLog, new_session_id

from .conftest import make_settings
from .support.client import RawClient, text
from .test_scale_out import cluster_of


async def _broker(url: str) -> Broker:
    node = Broker(make_settings(redis_url=url))
    await node.start()
    return node


async def test_sessions_spread_over_the_cluster_are_created_listed_and_loaded(
    redis_cluster_info: Any,
) -> None:
    node = await _broker(redis_cluster_info.url)
    try:
        client = await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp")
        ids = []
        for i in range(12):
            ids.append(await client.new_session(f"/c/{i % 3}"))
        masters = {redis_cluster_info.master_of(SessionKeys("default", s).log) for s in ids}
        assert len(masters) > 1  # the sessions really live on several masters
        reply = await client.call(
            "session/prompt", {"sessionId": ids[0], "prompt": text("/chunks 20")}
        )
        assert reply["result"]["stopReason"] == "end_turn"
        listed = (await client.call("session/list", {}))["result"]["sessions"]
        assert {s["sessionId"] for s in listed} == set(ids)
        assert listed[0]["sessionId"] == ids[0]
        in_cwd = (await client.call("session/list", {"cwd": "/c/1"}))["result"]["sessions"]
        assert {s["sessionId"] for s in in_cwd} == {ids[i] for i in range(1, 12, 3)}
        loader = await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp")
        await loader.call("session/load", {"sessionId": ids[0], "cwd": "/c/0", "mcpServers": []})
        assert loader.chunks(ids[0]) == [f"chunk {i}" for i in range(1, 21)]
        for c in (client, loader):
            await c.close()
    finally:
        await node.stop()


async def test_three_front_nodes_on_the_cluster_see_every_event_in_order(
    redis_cluster_info: Any, tmp_path: Path
) -> None:
    async with cluster_of(redis_cluster_info.url, tmp_path, fronts=3, hosts=1) as deployment:
        nodes = deployment.nodes
        clients = [await RawClient.connect(node.url) for node in nodes]
        for client in clients:
            await client.initialize()
        a = clients[0]
        session_id = await a.new_session("/c")
        for watcher in clients[1:]:
            assert "result" in await watcher.call(
                "session/resume", {"sessionId": session_id, "cwd": "/c"}
            )
        reply = await a.call(
            "session/prompt", {"sessionId": session_id, "prompt": text("/chunks 200")}, timeout=60
        )
        assert reply["result"]["stopReason"] == "end_turn"
        for client in clients:
            chunks = await client.read_chunks(session_id, 200, 30)
            assert chunks == [f"chunk {i}" for i in range(1, 201)]
            await client.close()


async def test_a_master_failover_during_traffic_loses_nothing_acknowledged(
    redis_cluster_info: Any,
) -> None:
    node = await _broker(redis_cluster_info.url)
    try:
        url = f"ws://127.0.0.1:{node.port}/acp"
        actor, watcher = await RawClient.connect(url), await RawClient.connect(url)
        for c in (actor, watcher):
            await c.initialize()
        session_id = await actor.new_session("/f")
        await watcher.call("session/resume", {"sessionId": session_id, "cwd": "/f"})
        master = redis_cluster_info.master_of(SessionKeys("default", session_id).log)
        replica = redis_cluster_info.replica_of(master)
        await actor.send_prompt("big", session_id, "/chunks 3000")
        await watcher.read_chunks(session_id, 200, 30)
        # Promote the replica while events are being appended.
        await asyncio.to_thread(redis_cluster_info.promote, replica)
        reply = await actor.reply_to("big", timeout=90)
        assert reply["result"]["stopReason"] == "end_turn", reply
        assert redis_cluster_info.master_of(SessionKeys("default", session_id).log) == replica
        expected = [f"chunk {i}" for i in range(1, 3001)]
        for client in (actor, watcher):
            assert await client.read_chunks(session_id, 3000, 60) == expected
            seqs = [u["_meta"]["acpBroker/position"]["seq"] for u in client.updates(session_id)]
            assert seqs == sorted(set(seqs))
        redis = connect(redis_cluster_info.url)
        events = await SessionLog(redis).read("default", session_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        await redis.aclose()
        for c in (actor, watcher):
            await c.close()
    finally:
        await node.stop()


async def test_an_agent_host_renews_its_leases_on_the_cluster(redis_cluster_info: Any) -> None:
    """Sessions on several masters: one renewal keeps them all (redis-py refuses scripts in
    a cluster pipeline, so renewals once failed there and every lease lapsed)."""
    from broker.store.leases import Leases

    store = connect(redis_cluster_info.url)
    try:
        session_log = SessionLog(store)
        ids = [new_session_id() for _ in range(8)]
        for sid in ids:
            created = {"type": "created", "cwd": "/l", "agent": "demo", "kind": "combined"}
            await session_log.create("default", sid, created)
        masters = {redis_cluster_info.master_of(SessionKeys("default", s).log) for s in ids}
        assert len(masters) > 1
        mine, theirs = Leases(store, "host-a"), Leases(store, "host-b")
        for sid in ids[:6]:
            await mine.acquire("default", sid)
        for sid in ids[6:]:
            await theirs.acquire("default", sid)
        held = [("default", sid) for sid in ids]
        assert await mine.renew(held[:6]) == []
        assert await mine.renew(held) == held[6:]  # not this host's
    finally:
        await store.aclose()
