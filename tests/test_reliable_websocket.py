"""ACP Remote's reliable transport on WebSocket (the draft's provisional names), driven over
real sockets against a real Redis: delivery records at consecutive cursors, resume after the
last cursor applied with nothing lost or repeated, fencing of an older socket, ``cursor_gap``
past what the stream keeps, and the recovery by ``session/resume``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import websockets

from broker.serve import Broker

from .conftest import make_settings
from .support.client import text
from .support.reliable import SUBPROTOCOL, ReliableClient, flat, is_response, opening


@pytest.fixture
def store_kind() -> str:
    return "redis"


def _idle(message: Any) -> bool:
    update = message.get("params", {}).get("update", {}) if isinstance(message, dict) else {}
    return update.get("sessionUpdate") == "state_update" and update.get("state") == "idle"


def _positions(messages: list[Any]) -> list[tuple[int, str]]:
    """The session updates' positions (v2 derives a state update from a position's event
    too: each with its kind)."""
    return [
        (
            m["params"]["_meta"]["acpBroker/position"]["seq"],
            m["params"]["update"]["sessionUpdate"],
        )
        for m in flat(messages)
        if m.get("method") == "session/update" and "acpBroker/position" in m["params"]["_meta"]
    ]


async def _session(client: ReliableClient) -> str:
    reply = await client.call("session/new", {"cwd": "/tmp/reliable", "mcpServers": []})
    return str(reply["result"]["sessionId"])


async def test_a_negotiating_client_gets_delivery_records_and_acknowledges(url: str) -> None:
    client = ReliableClient()
    answer = await client.connect(url)
    result = answer["result"]
    assert result["protocolVersion"] == 2 and result["capabilities"]["remote"] == {"core": {}}
    remote = result["remote"]
    assert remote["profile"] == "acp.remote.v2" and remote["generation"] == "1"
    assert remote["startCursor"] == "0" and len(remote["resumeSecret"]) >= 40
    session_id = await _session(client)
    msg_id = await client.submit("session/prompt", {"sessionId": session_id, "prompt": text("hi")})
    # Everything goes on the one stream: the answer, the updates, the agent's question.
    await client.until(lambda m: m.get("method") == "session/request_permission")
    asked = flat([m for _, m in client.applied])[-1]
    option = asked["params"]["options"][0]["optionId"]
    answer_to_agent = {
        "jsonrpc": "2.0",
        "id": asked["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": option}},
    }
    await client.send_message(answer_to_agent)
    await client.until(_idle)
    assert any(is_response(msg_id)(m) for m in flat([m for _, m in client.applied]))
    await client.ack()
    await client.ack()  # again: no change
    assert await client.call("session/list", {})
    assert client.errors == []
    await client.ws.close()


async def test_a_resumed_socket_gets_what_followed_the_cursor_once(url: str) -> None:
    client = ReliableClient()
    await client.connect(url)
    session_id = await _session(client)
    msg_id = await client.submit(
        "session/prompt", {"sessionId": session_id, "prompt": text("/notool resumed")}
    )
    await client.until(is_response(msg_id))  # the rest of the turn is not read here
    before = [m for _, m in client.applied]
    await client.ws.close()
    answer = await client.connect(url, resume=True)
    assert answer["result"]["remote"]["generation"] == "2"
    after = await client.until(_idle)
    positions = _positions(before + after)
    seqs = [seq for seq, _ in positions]
    assert seqs == sorted(seqs) and len(set(positions)) == len(positions)
    assert await client.call("session/list", {})  # submissions go on after a resume
    # The same cursor once more: nothing new is lost, nothing old comes again.
    last = client.cursor
    await client.connect(url, resume=True)
    await client.call("session/list", {})
    assert client.applied[-1][0] == last + 1 and client.errors == []


async def test_a_newer_socket_fences_the_older(url: str) -> None:
    first = ReliableClient()
    await first.connect(url)
    await _session(first)
    old_ws = first.ws
    second = ReliableClient()
    second.conn_id, second.generation, second.secret = first.conn_id, "", first.secret
    second.cursor = first.cursor
    first.ws = None  # both sockets stay open
    assert "result" in await second.connect(url, resume=True)
    fenced = json.loads(await old_ws.recv())
    while fenced.get("type") == "delivery":  # what it had not read yet
        fenced = json.loads(await old_ws.recv())
    assert fenced["error"]["data"]["condition"] == "connection_fenced"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await old_ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert await second.call("session/list", {})


async def test_a_bad_frame_is_answered_and_changes_nothing(url: str) -> None:
    client = ReliableClient()
    await client.connect(url)
    for bad in (
        "not json",
        json.dumps({"type": "submission", "connectionId": "other", "generation": "1"}),
        json.dumps(client.frame("submission", payload={"type": "jsonrpc", "message": {}})),
        json.dumps(client.frame("ack", cursor="99")),
    ):
        await client.ws.send(bad)
        error = json.loads(await client.ws.recv())
        assert error["id"] is None and error["error"]["code"] == -32600
    assert await client.call("session/list", {})


async def test_without_the_profile_the_socket_is_refused(url: str) -> None:
    async with websockets.connect(url, subprotocols=[SUBPROTOCOL]) as ws:
        plain = opening({"type": "new"})
        del plain["params"]["remote"]
        await ws.send(json.dumps(plain))
        error = json.loads(await ws.recv())["error"]
        assert error["data"]["condition"] == "unsupported_profile"
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
    client = ReliableClient()
    client.conn_id, client.secret, client.generation = "nope", "bad", "1"
    answer = await client.connect(url, resume=True)
    assert answer["error"]["data"]["condition"] == "invalid_resume"


async def test_past_retention_cursor_gap_then_session_resume(store: Any) -> None:
    # Connection streams that keep 16 messages.
    async with Broker(make_settings(http_retained_messages=16), redis=store) as node:
        await _gap_then_resume(f"ws://127.0.0.1:{node.port}/acp")


async def _gap_then_resume(url: str) -> None:
    client = ReliableClient()
    await client.connect(url)
    session_id = await _session(client)
    kept = client.cursor
    prompt = {"sessionId": session_id, "prompt": text("/chunks 100")}
    await client.submit("session/prompt", prompt)
    await client.until(_idle)  # over a hundred records: more than the stream keeps
    client.cursor = kept  # a client that applied no more than this
    refused = await client.connect(url, resume=True)
    data = refused["error"]["data"]
    assert data["condition"] == "cursor_gap" and int(data["oldest"]) > kept + 1
    fresh = ReliableClient()
    await fresh.connect(url)
    reply = await fresh.call("session/resume", {"sessionId": session_id, "cwd": "/tmp/reliable"})
    assert "result" in reply, reply


async def test_a_submission_sent_again_with_its_operation_id_runs_once(url: str) -> None:
    client = ReliableClient()
    await client.connect(url)
    params = {"cwd": "/tmp/reliable", "mcpServers": []}
    replies = []
    for msg_id in (101, 102):  # a retry: another attempt id, the same operation
        message = {"jsonrpc": "2.0", "id": msg_id, "method": "session/new", "params": params}
        await client.send_message(message, "op_new_once")
        replies.append((await client.until(is_response(msg_id)))[-1])
    assert replies[0]["result"]["sessionId"] == replies[1]["result"]["sessionId"], replies
