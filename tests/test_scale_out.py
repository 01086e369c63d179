"""Many front nodes, agent hosts and projectors on one Redis, as separate processes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.store.client import commands, connect
from broker.store.keys import lease_key
from broker.store.log import SessionLog

from .support.broker_process import broker_process
from .support.client import RawClient, text, wait_for
from .support.roles import role_process

FRONT_ONLY = ("--no-workers",)


@dataclass
class Deployment:
    """The processes of a multi-node test: front nodes, agent hosts, projectors."""

    nodes: list[Any]
    hosts: list[Any]
    projectors: list[Any]


@contextlib.asynccontextmanager
async def cluster_of(
    redis_url: str,
    tmp_path: Path,
    *,
    fronts: int,
    hosts: int,
    projectors: int = 1,
    front_env: dict[str, str] | None = None,
) -> AsyncIterator[Deployment]:
    async with contextlib.AsyncExitStack() as stack:
        host_procs = [
            await stack.enter_async_context(
                role_process(
                    "agent-host",
                    redis_url,
                    tmp_path / f"host{i}.log",
                    env={"ACP_BROKER_LEASE_TTL": "2"},
                )
            )
            for i in range(hosts)
        ]
        projector_procs = [
            await stack.enter_async_context(
                role_process(
                    "projector",
                    redis_url,
                    tmp_path / f"projector{i}.log",
                    env={"ACP_BROKER_PROJECTOR_CLAIM_IDLE": "2"},
                )
            )
            for i in range(projectors)
        ]
        nodes = [
            await stack.enter_async_context(
                broker_process(
                    redis_url,
                    log_path=tmp_path / f"front{i}.log",
                    extra_args=FRONT_ONLY,
                    env=front_env,
                )
            )
            for i in range(fronts)
        ]
        yield Deployment(nodes, host_procs, projector_procs)


async def test_a_session_watched_from_three_nodes_reaches_every_connection_in_order(
    redis_url: str, tmp_path: Path
) -> None:
    async with cluster_of(redis_url, tmp_path, fronts=3, hosts=1) as deployment:
        nodes = deployment.nodes
        clients = [await RawClient.connect(node.url) for node in nodes]
        for client in clients:
            await client.initialize()
        a, b, c = clients
        session_id = await a.new_session("/tmp/s")
        for watcher in (b, c):
            reply = await watcher.call("session/resume", {"sessionId": session_id, "cwd": "/tmp/s"})
            assert "result" in reply
        reply = await a.call(
            "session/prompt", {"sessionId": session_id, "prompt": text("/chunks 300")}, timeout=60
        )
        assert reply["result"]["stopReason"] == "end_turn"
        expected = [f"chunk {i}" for i in range(1, 301)]
        for client in clients:
            assert await client.read_chunks(session_id, 300, 30) == expected
            seqs = [u["_meta"]["acpBroker/position"]["seq"] for u in client.updates(session_id)]
            assert seqs == sorted(set(seqs))
        # A prompt from node 2: its permission request goes to node 2's connection.
        await b.send_prompt("b1", session_id, "read")
        await b.read_until(
            lambda: any(m.get("method") == "session/request_permission" for m in b.inbox), 30
        )
        [ask] = [m for m in b.inbox if m.get("method") == "session/request_permission"]
        await b.send(
            {
                "jsonrpc": "2.0",
                "id": ask["id"],
                "result": {
                    "outcome": {
                        "outcome": "selected",
                        "optionId": ask["params"]["options"][0]["optionId"],
                    }
                },
            }
        )
        reply = await b.reply_to("b1", timeout=30)
        assert reply["result"]["stopReason"] == "end_turn", reply
        # Only the prompting connection was asked.
        for other in (a, c):
            assert not [m for m in other.inbox if m.get("method") == "session/request_permission"]
        for client in clients:
            await client.close()


async def test_a_killed_agent_host_hands_its_sessions_to_another(
    redis_url: str, tmp_path: Path
) -> None:
    async with cluster_of(redis_url, tmp_path, fronts=1, hosts=2) as deployment:
        nodes, hosts = deployment.nodes, deployment.hosts
        client = await RawClient.initialized(nodes[0].url)
        session_id = await client.new_session("/tmp/k")
        redis = connect(redis_url)
        holder = await commands(redis).get(lease_key("default", session_id))
        assert holder
        await client.send_prompt("slow", session_id, "/slow 100")
        await client.read_chunks(session_id, 3, 20)
        # kill -9 the host that holds the session, mid-prompt.
        await _kill_holder(hosts, holder)
        reply = await client.reply_to("slow", timeout=30)
        assert reply["error"]["code"] == -32603

        # Taken over within a bounded time by the surviving host.
        async def new_holder() -> str | None:
            value = await commands(redis).get(lease_key("default", session_id))
            return value if value and value != holder else None

        assert await wait_for(new_holder, 20) != holder
        again = await client.call(
            "session/prompt", {"sessionId": session_id, "prompt": text("/notool again")}, timeout=30
        )
        assert again["result"]["stopReason"] == "end_turn"
        events = await SessionLog(redis).read("default", session_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        ends = [e.body for e in events if e.type == "prompt_end"]
        assert "error" in ends[0] and ends[-1]["stopReason"] == "end_turn"
        await redis.aclose()
        await client.close()


async def _kill_holder(hosts: list, holder: str) -> None:
    """Kill -9 the host process whose id holds the lease (hosts print their id when ready)."""
    for host in hosts:
        if holder in host.ready_line:
            await host.kill()
            return
    raise AssertionError(f"no host process is {holder}")


async def test_a_client_whose_node_dies_resumes_on_another_with_every_event_once(
    redis_url: str, tmp_path: Path
) -> None:
    async with cluster_of(redis_url, tmp_path, fronts=2, hosts=1) as deployment:
        nodes = deployment.nodes
        first = await RawClient.initialized(nodes[0].url)
        session_id = await first.new_session("/tmp/r")
        await first.send_prompt("p", session_id, "/slow 30")
        await first.read_chunks(session_id, 5, 20)
        seen = first.updates(session_id)
        last = seen[-1]["_meta"]["acpBroker/position"]
        await nodes[0].kill()
        second = await RawClient.initialized(nodes[1].url)
        reply = await second.call(
            "session/resume",
            {"sessionId": session_id, "cwd": "/tmp/r", "_meta": {"acpBroker/replayAfter": last}},
        )
        assert "result" in reply
        await second.read_until(
            lambda: any(
                m.get("method") == "session/update"
                and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
                and m["params"]["update"]["content"]["text"] == "chunk 30"
                for m in second.inbox
            ),
            30,
        )
        chunks = first.chunks(session_id) + second.chunks(session_id)
        assert chunks == [f"chunk {i}" for i in range(1, 31)]
        await second.close()


async def test_a_host_that_lost_its_lease_can_never_append_again(redis_url: str) -> None:
    """Fencing: once another host took the session, the old host's appends are refused."""
    from broker.store.events import EventType
    from broker.store.leases import HeldElsewhere, Leases
    from broker.store.log import Fenced, new_session_id

    redis = connect(redis_url)
    session_log = SessionLog(redis)
    sid = new_session_id()
    await session_log.create("default", sid, {"type": EventType.CREATED, "cwd": "/f"})
    # 2 s: the old lease outlives the one acquire that checks it is live, however loaded
    # the machine; then its lapse is waited for.
    old = await Leases(redis, "host-old", ttl=2.0).acquire("default", sid)
    with contextlib.suppress(HeldElsewhere):
        await Leases(redis, "host-new", ttl=5).acquire("default", sid)
        raise AssertionError("a live lease was taken")
    await wait_for(lambda: _lapsed(redis, sid), what="the old lease to lapse")
    new = await Leases(redis, "host-new", ttl=5).acquire("default", sid)
    assert new.fence != old.fence
    update = {"type": EventType.UPDATE, "update": {"sessionUpdate": "agent_message_chunk"}}
    with contextlib.suppress(Fenced):
        await session_log.append("default", sid, update, fence=old.fence)
        raise AssertionError("a stale host appended")
    assert (await session_log.append("default", sid, update, fence=new.fence)).seq == 2
    await redis.aclose()


async def _lapsed(redis: Any, sid: str) -> bool:
    return not await redis.exists(lease_key("default", sid))
