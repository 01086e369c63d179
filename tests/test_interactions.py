"""Durable pending interactions, driven as users drive them: WebSocket ACP clients (plain,
and ones that negotiated the draft's ``capabilities.remote``), REST and MCP, against a
broker on a real redis-server with the demo agent as a subprocess.

The demo agent asks ``session/request_permission`` (Allow / Reject) for a turn that reads a
file ("read it")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from mcp import Client

from broker.serve import Broker
from broker.store import hosts
from broker.store.client import commands, connect
from broker.store.keys import lease_key

from .conftest import make_settings
from .support.client import RawClient, tool_result_text, wait_for
from .support.roles import role_process
from .test_scale_out import cluster_of

ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
ASK = "session/request_permission"


@pytest.fixture
async def node(redis_url: str) -> AsyncIterator[Broker]:
    store = connect(redis_url)
    broker = Broker(make_settings(client_reconnect_grace=0.5), redis=store)
    await broker.start()
    yield broker
    await broker.stop()
    await store.aclose()


def ws_url(node: Broker) -> str:
    return f"ws://127.0.0.1:{node.port}/acp"


def http_base(node: Broker) -> str:
    return f"http://127.0.0.1:{node.http_port}"


async def remote_client(node: Broker) -> RawClient:
    """A client that negotiated the draft (``capabilities.remote``)."""
    client = await RawClient.connect(ws_url(node))
    caps: dict[str, Any] = {"remote": {"core": {}}}
    reply = await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
    assert "result" in reply, reply
    return client


async def load(client: RawClient, session_id: str) -> None:
    params = {"sessionId": session_id, "cwd": "/srv/i", "mcpServers": []}
    reply = await client.call("session/load", params)
    assert "result" in reply, reply


def asks(client: RawClient) -> list[dict[str, Any]]:
    return [m for m in client.inbox if m.get("method") == ASK]


def interaction_updates(client: RawClient) -> list[dict[str, Any]]:
    """The interaction records the client was told of, in order."""
    return [
        m["params"]["update"]["_meta"]["acpBroker/interaction"]
        for m in client.inbox
        if m.get("method") == "session/update"
        and "acpBroker/interaction" in (m["params"]["update"].get("_meta") or {})
    ]


async def logged(node: Broker, session_id: str) -> list[dict[str, Any]]:
    """The session's interaction events, as logged."""
    events = await node.log.read(node.settings.tenant, session_id)
    return [e.body["interaction"] for e in events if e.type == "interaction"]


async def asking_session(node: Broker) -> tuple[RawClient, str]:
    """A plain window whose turn waits on a permission request (not answered)."""
    window = await RawClient.initialized(ws_url(node))
    session_id = await window.new_session("/srv/i")
    await window.send_prompt(1, session_id, "read it")
    await window.read_until(lambda: asks(window), 20)
    assert asks(window)[0]["params"]["_meta"]["acpBroker/interactionId"].startswith("interaction_")
    return window, session_id


async def test_rest_lists_and_answers_and_every_window_sees_who(node: Broker) -> None:
    window, session_id = await asking_session(node)
    watcher = await remote_client(node)
    await load(watcher, session_id)
    async with httpx.AsyncClient(base_url=http_base(node), timeout=30) as http:
        listed = (await http.get(f"/v1/sessions/{session_id}/interactions")).json()
        [pending] = listed["interactions"]
        assert (pending["kind"], pending["state"], pending["revision"]) == (
            "permission",
            "open",
            "1",
        )
        assert [o["optionId"] for o in pending["options"]] == ["allow_once", "reject_once"]
        assert pending["request"]["toolCall"]["title"] == "Read README.md"
        path = f"/v1/sessions/{session_id}/interactions/{pending['id']}/respond"
        bad = await http.post(path, json={"optionId": "always"})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument"
        done = await http.post(path, json={"optionId": "allow_once", "expectedRevision": "1"})
        assert done.status_code == 200, done.text
        resolved = done.json()
        assert resolved["state"] == "resolved" and resolved["resolvedBy"].startswith("participant_")
        again = await http.post(path, json={"optionId": "reject_once"})
        assert again.status_code == 409 and again.json()["code"] == "revision_conflict"
        assert (await http.get(f"/v1/sessions/{session_id}/interactions")).json()[
            "interactions"
        ] == []
    # The agent heard the answer: the turn ends; the window's question is withdrawn.
    reply = await window.reply_to(1, 20)
    assert reply["result"]["stopReason"] == "end_turn"
    # Every attachment saw the lifecycle, the resolver named.
    await watcher.read_until(
        lambda: any(u["state"]["type"] == "resolved" for u in interaction_updates(watcher)), 10
    )
    states = [u["state"]["type"] for u in interaction_updates(watcher)]
    assert states == ["open", "resolved"]
    assert interaction_updates(watcher)[-1]["state"]["resolvedBy"] == resolved["resolvedBy"]
    # Logged before the agent heard it: the resolution precedes the tool's result.
    events = await node.log.read(node.settings.tenant, session_id)
    kinds = [
        "resolved"
        if e.type == "interaction" and e.body["interaction"]["state"]["type"] == "resolved"
        else e.body.get("update", {}).get("status")
        for e in events
    ]
    assert kinds.index("resolved") < kinds.index("completed")
    await window.close()
    await watcher.close()


async def test_remote_clients_discover_claim_and_compare_and_set(node: Broker) -> None:
    window, session_id = await asking_session(node)
    first = await remote_client(node)
    await load(first, session_id)
    listed = await first.call("interaction/list", {"sessionId": session_id})
    [pending] = listed["result"]["interactions"]
    iid = pending["interactionId"]
    await first.close()
    # Discovery after reconnect: a new connection lists the same interaction.
    b, c = await remote_client(node), await remote_client(node)
    for client in (b, c):
        await load(client, session_id)
        again = await client.call("interaction/list", {"sessionId": session_id})
        assert [i["interactionId"] for i in again["result"]["interactions"]] == [iid]
    # Concurrent compare-and-set: two claims at revision 1, one wins.
    claim = {"sessionId": session_id, "interactionId": iid, "expectedRevision": "1"}
    short = {**claim, "requestedTtlSeconds": "0.5"}
    replies = await asyncio.gather(
        b.call("interaction/claim", short), c.call("interaction/claim", short)
    )
    won = [r for r in replies if "result" in r]
    lost = [r for r in replies if "error" in r]
    assert len(won) == 1 and len(lost) == 1, replies
    assert lost[0]["error"]["data"]["condition"] == "revision_conflict"
    assert lost[0]["error"]["data"]["currentInteractionRevision"] == "2"
    # The claim expires: the interaction is open again (revision 3), for anyone.
    await c.read_until(
        lambda: any(
            u["revision"] == "3" and u["state"]["type"] == "open" for u in interaction_updates(c)
        ),
        10,
    )
    taken = await c.call("interaction/claim", {**claim, "expectedRevision": "3"})
    state = taken["result"]["interaction"]["state"]
    assert state["type"] == "claimed" and state["fencingToken"] == "2"
    # Only the current claim answers: another's attempt with its id is refused.
    answer = {
        "sessionId": session_id,
        "interactionId": iid,
        "claimId": state["claimId"],
        "fencingToken": state["fencingToken"],
        "expectedRevision": "4",
        "response": ALLOW,
    }
    stolen = await b.call("interaction/respond", answer)
    assert stolen["error"]["data"]["condition"] == "revision_conflict"
    done = await c.call("interaction/respond", answer)
    assert done["result"]["interaction"]["state"]["type"] == "resolved"
    late = await b.call("interaction/respond", answer)  # a retry after the end: terminal
    assert late["error"]["data"]["condition"] == "revision_conflict"
    assert (await window.reply_to(1, 20))["result"]["stopReason"] == "end_turn"
    states = [(i["revision"], i["state"]["type"]) for i in await logged(node, session_id)]
    assert states == [
        ("1", "open"),
        ("2", "claimed"),
        ("3", "open"),
        ("4", "claimed"),
        ("5", "resolved"),
    ]
    for client in (window, b, c):
        await client.close()


async def test_plain_clients_get_no_interaction_methods(node: Broker) -> None:
    window, session_id = await asking_session(node)
    reply = await window.call("interaction/list", {"sessionId": session_id})
    assert reply["error"]["code"] == -32601
    await window.send({"jsonrpc": "2.0", "id": asks(window)[0]["id"], "result": ALLOW})
    assert (await window.reply_to(1, 20))["result"]["stopReason"] == "end_turn"
    [*_, resolved] = await logged(node, session_id)
    assert resolved["state"]["type"] == "resolved" and resolved["state"]["result"] == ALLOW
    await window.close()


async def test_an_approver_gone_strands_nothing_mcp_answers(node: Broker) -> None:
    window, session_id = await asking_session(node)
    await window.close()  # the only window closes before answering
    async with Client(f"{http_base(node)}/mcp") as client:
        listed = tool_result_text(await client.call_tool("interaction_list", {"id": session_id}))
        assert "  permission  open  revision 1" in listed
        assert "option allow_once: Allow" in listed
        iid = listed.split()[0]
        result = await client.call_tool(
            "interaction_respond",
            {"id": session_id, "interactionId": iid, "optionId": "reject_once"},
        )
        assert not result.is_error, tool_result_text(result)
        assert "resolved" in tool_result_text(result)
        again = await client.call_tool(
            "interaction_respond",
            {"id": session_id, "interactionId": iid, "optionId": "reject_once"},
        )
        assert again.is_error and tool_result_text(again).startswith("revision_conflict")

    async def ended() -> bool:
        events = await node.log.read(node.settings.tenant, session_id)
        return any(e.type == "prompt_end" for e in events)

    await wait_for(ended, 20, "the turn's end")


async def test_a_cancelled_turn_cancels_its_interaction(node: Broker) -> None:
    window, session_id = await asking_session(node)
    await window.send(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
    )
    assert (await window.reply_to(1, 20))["result"]["stopReason"] == "cancelled"

    async def cancelled() -> bool:
        return [i["state"]["type"] for i in await logged(node, session_id)] == [
            "open",
            "cancelled",
        ]

    await wait_for(cancelled, 10, "the interaction cancelled")
    await window.close()


async def test_nobody_answering_expires_the_interaction(redis_url: str) -> None:
    store = connect(redis_url)
    broker = Broker(make_settings(client_request_timeout=1.0), redis=store)
    await broker.start()
    try:
        window = await RawClient.initialized(ws_url(broker))
        session_id = await window.new_session("/srv/i")
        await window.send_prompt(1, session_id, "read it")
        await window.read_until(lambda: asks(window), 20)
        await window.reply_to(1, 20)  # the turn ends once the question expired

        states = [i["state"]["type"] for i in await logged(broker, session_id)]
        assert states == ["open", "expired"]
        await window.close()
    finally:
        await broker.stop()
        await store.aclose()


@pytest.mark.slow
async def test_a_front_killed_mid_interaction_loses_nothing(redis_url: str, tmp_path: Path) -> None:
    """The asking window's front is killed while the question is open: the interaction
    stays in the log and at the host, and a draft client on the other front answers it."""
    async with cluster_of(redis_url, tmp_path, fronts=2, hosts=1) as deployment:
        first, second = deployment.nodes
        window = await RawClient.connect(first.url)
        await window.initialize()
        session_id = await window.new_session("/srv/i", timeout=30)
        await window.send_prompt(1, session_id, "read it")
        await window.read_until(lambda: asks(window), 30)
        other = await RawClient.connect(second.url)
        caps: dict[str, Any] = {"remote": {"core": {}}}
        await other.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
        await load(other, session_id)
        await first.kill()
        listed = await other.call("interaction/list", {"sessionId": session_id})
        [pending] = listed["result"]["interactions"]
        assert pending["state"]["type"] == "open"
        claim = {
            "sessionId": session_id,
            "interactionId": pending["interactionId"],
            "expectedRevision": pending["revision"],
        }
        taken = (await other.call("interaction/claim", claim))["result"]["interaction"]
        answer = {
            **claim,
            "claimId": taken["state"]["claimId"],
            "fencingToken": taken["state"]["fencingToken"],
            "expectedRevision": taken["revision"],
            "response": ALLOW,
        }
        done = await other.call("interaction/respond", answer)
        assert done["result"]["interaction"]["state"]["type"] == "resolved", done

        def tool_completed() -> bool:
            return any(
                u["update"].get("sessionUpdate") == "tool_call_update"
                and u["update"].get("status") == "completed"
                for u in other.updates(session_id)
            )

        await other.read_until(tool_completed, 30)  # the agent heard the answer
        states = [u["state"]["type"] for u in interaction_updates(other)]
        assert states[-1] == "resolved"
        await other.close()


async def test_a_lapsed_lease_key_of_a_held_session_is_waited_out_not_taken_for_nobody(
    node: Broker,
) -> None:
    """The session's lease key is gone (a renewal late under load) while its host still
    holds it and the question waits: ``interaction/list`` waits for the renewal and names
    the question (it answered "nothing pending" then); a claim on a session no host holds
    is refused as unknown, not answered with an empty result."""
    window, session_id = await asking_session(node)
    watcher = await remote_client(node)
    await load(watcher, session_id)
    await commands(node.redis).delete(lease_key(node.settings.tenant, session_id))
    listed = await watcher.call("interaction/list", {"sessionId": session_id})
    assert [i["state"]["type"] for i in listed["result"]["interactions"]] == ["open"]
    other = await window.new_session("/srv/i")  # no question: then released, held by nobody
    await load(watcher, other)
    await node.agents.release(node.settings.tenant, other)
    claim = {"sessionId": other, "interactionId": "interaction_00", "expectedRevision": "1"}
    refused = await watcher.call("interaction/claim", claim)
    assert refused["error"]["data"]["condition"] == "revision_conflict", refused
    for client in (window, watcher):
        await client.close()


async def test_with_no_agent_host_alive_the_lists_answer_empty_at_once(
    redis_url: str, tmp_path: Path
) -> None:
    """The session's host is killed while its question waits and no other host is left:
    nobody holds the session, nor will, so ACP, REST and MCP answer "nothing pending" at
    once, not at their routing deadline (30 s)."""
    store = connect(redis_url)
    front = Broker(make_settings(workers=False), redis=store)
    await front.start()
    try:
        lease = {"ACP_BROKER_LEASE_TTL": "2"}
        async with role_process("agent-host", redis_url, tmp_path / "host.log", env=lease) as host:
            window = await remote_client(front)
            session_id = await window.new_session("/srv/i", timeout=30)
            await window.send_prompt(1, session_id, "read it")
            await window.read_until(lambda: asks(window), 30)
            listed = await window.call("interaction/list", {"sessionId": session_id})
            assert len(listed["result"]["interactions"]) == 1, listed
            await host.kill()

        async def no_host() -> bool:
            return not await hosts.any_alive(store)

        await wait_for(no_host, 30, "the killed host's announcement lapsed")
        loop = asyncio.get_running_loop()
        started = loop.time()
        listed = await window.call("interaction/list", {"sessionId": session_id})
        assert listed["result"]["interactions"] == [], listed
        assert loop.time() - started < 5
        async with httpx.AsyncClient(base_url=http_base(front), timeout=30) as http:
            started = loop.time()
            answer = await http.get(f"/v1/sessions/{session_id}/interactions")
            assert loop.time() - started < 5
        assert answer.status_code == 200 and answer.json()["interactions"] == [], answer.text
        async with Client(f"{http_base(front)}/mcp") as client:
            started = loop.time()
            result = await client.call_tool("interaction_list", {"id": session_id})
            assert loop.time() - started < 5
        assert tool_result_text(result) == "nothing is waiting for an answer", result
        await window.close()
    finally:
        await front.stop()
        await store.aclose()
