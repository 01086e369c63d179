"""ACP v2 on the same endpoint as v1, against the same sessions (issue 3).

Every client here is a :class:`CheckedClient`: each message the broker sends it is
validated against the official JSON Schema of the version it negotiated.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets

from broker.front.acp.connection import BATCHED_REPLAY_META
from broker.protocol.v2 import REPLAY_POSITION
from broker.serve import Broker
from broker.store.client import commands
from broker.store.keys import SessionKeys

from .conftest import make_settings
from .support.client import REPLY_WAIT, text, wait_for
from .support.schemas import WireChecker
from .support.wire import INIT_PARAMS, CheckedClient

START = {"type": "start"}


def position(update: dict[str, Any]) -> dict[str, Any]:
    return dict(update["_meta"]["acpBroker/position"])


def messages_before(client: CheckedClient, reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The session/update params a client was sent before ``reply``."""
    index = next(i for i, m in enumerate(client.received) if m is reply)
    return [
        m["params"]
        for m in client.received[:index]
        if isinstance(m, dict) and m.get("method") == "session/update"
    ]


async def resume(
    client: CheckedClient, session_id: str, cwd: str, *, timeout: float = REPLY_WAIT, **params: Any
) -> Any:
    """Resume a session on ``client``: its reply and the updates replayed before it (each
    message waited for ``timeout`` seconds at most)."""
    before = len(client.received)
    reply = await client.call(
        "session/resume", {"sessionId": session_id, "cwd": cwd, **params}, timeout
    )
    replayed = [
        m["params"]
        for m in client.received[before:]
        if isinstance(m, dict) and m.get("method") == "session/update"
    ]
    return reply, replayed


# -- initialize -------------------------------------------------------------------------------


@pytest.mark.parametrize(("asked", "expected"), [(1, 1), (2, 2), (0, 2), (3, 2), (99, 2)])
async def test_version_negotiation(url: str, asked: int, expected: int) -> None:
    async with websockets.connect(url) as ws:
        params = {**INIT_PARAMS[2], "protocolVersion": asked} if asked != 1 else INIT_PARAMS[1]
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
        )
        reply = json.loads(await ws.recv())
    checker = WireChecker(expected)
    checker.sending({"jsonrpc": "2.0", "id": 0, "method": "initialize"})
    checker.check(reply)
    result = reply["result"]
    assert result["protocolVersion"] == expected
    if expected == 1:
        assert "agentCapabilities" in result and "capabilities" not in result
        return
    assert "agentCapabilities" not in result and "agentInfo" not in result
    assert result["info"]["name"] == "acp-broker"
    session = result["capabilities"]["session"]
    assert session["delete"] == {} and session["additionalDirectories"] == {}
    assert session["title"] == {}  # session/set_title, ACP unstable
    # What depends on the agents is what every one advertised (the plain agent: nothing).
    assert session["mcp"] == {"stdio": {}} and session["prompt"] == {}
    assert result["authMethods"] == []


@pytest.mark.parametrize("asked", ["2", -1, 2.0, None, True])
async def test_a_protocol_version_that_is_not_a_version_is_invalid_params(
    url: str, asked: Any
) -> None:
    async with websockets.connect(url) as ws:
        params = {**INIT_PARAMS[2], "protocolVersion": asked}
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
        )
        reply = json.loads(await ws.recv())
        assert reply["error"]["code"] == -32602, reply
        # The connection is still uninitialized: a proper initialize then succeeds.
        await ws.send(
            json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT_PARAMS[2]}
            )
        )
        assert json.loads(await ws.recv())["result"]["protocolVersion"] == 2


async def test_auth_methods_are_not_advertised_so_auth_calls_are_refused(url: str) -> None:
    client = await CheckedClient.open(url, 2)
    for method in ("auth/login", "auth/logout"):
        reply = await client.call(method, {"methodId": "agent"})
        assert reply["error"]["code"] == -32601, reply
    # v1 methods that v2 removed are unknown on a v2 connection.
    for method in ("session/load", "session/set_mode"):
        reply = await client.call(method, {"sessionId": "sess_x", "cwd": "/tmp", "modeId": "x"})
        assert reply["error"]["code"] == -32601, reply
    await client.close()


# -- one session, both versions ---------------------------------------------------------------


async def test_v1_and_v2_viewers_of_one_session_each_get_their_version(url: str) -> None:
    v2 = await CheckedClient.open(url, 2)
    session_id = await v2.new(cwd="/tmp/mixed")
    v1 = await CheckedClient.open(url, 1)
    assert "result" in (
        await v1.call("session/resume", {"sessionId": session_id, "cwd": "/tmp/mixed"})
    )

    reply = await v2.prompt(session_id, "hello mixed")
    assert list(reply["result"]) == ["messageId"]
    await v2.until_idle(session_id)
    await v1.read_until(lambda: "session_info_update" in v1.kinds(session_id))

    # v2: the prompt lifecycle in state updates, upsert tool calls, message ids.
    kinds = v2.kinds(session_id)
    start = kinds.index("user_message")
    assert kinds[start : start + 2] == ["user_message", "state_update"]
    assert "tool_call" not in kinds and "tool_call_update" in kinds
    assert v2.states(session_id) == ["running", "requires_action", "running", "idle:end_turn"]
    updates = [u["update"] for u in v2.updates(session_id)]
    [user] = [u for u in updates if u["sessionUpdate"] == "user_message"]
    assert user["content"] == text("hello mixed")
    assert user["messageId"] == reply["result"]["messageId"]  # the inserted message's id
    agent_ids = {u["messageId"] for u in updates if u["sessionUpdate"] == "agent_message_chunk"}
    assert len(agent_ids) == 1 and user["messageId"] not in agent_ids
    [asked] = v2.permission_requests
    assert asked["params"]["title"] == "Read README.md"
    assert asked["params"]["subject"]["type"] == "tool_call"

    # v1: chunks, tool_call then tool_call_update, no v2 state; the same positions.
    assert "state_update" not in v1.kinds(session_id)
    assert "tool_call" in v1.kinds(session_id)
    assert v1.texts(session_id, "user_message_chunk") == "hello mixed"
    assert v1.texts(session_id) == v2.texts(session_id) == "You said: hello mixed"
    v1_seqs = {position(u)["seq"] for u in v1.updates(session_id)}
    assert v1_seqs <= {position(u)["seq"] for u in v2.updates(session_id)}

    # A prompt typed in the v1 window: the v2 window sees it as a user_message and a turn.
    v1_reply = await v1.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/notool from v1")}
    )
    assert v1_reply["result"]["stopReason"] == "end_turn"
    await v2.until_idle(session_id, count=2)
    users = [
        u["update"]
        for u in v2.updates(session_id)
        if u["update"]["sessionUpdate"] == "user_message"
    ]
    assert users[-1]["content"] == text("/notool from v1")
    assert v2.states(session_id)[-2:] == ["running", "idle:end_turn"]
    for client in (v1, v2):
        await client.close()


async def test_a_second_v2_window_sees_the_prompt_typed_in_the_first(url: str) -> None:
    typist = await CheckedClient.open(url, 2)
    session_id = await typist.new()
    watcher = await CheckedClient.open(url, 2)
    reply, replayed = await resume(watcher, session_id, "/tmp/v2")
    # Nothing replayed; the window whole (the agent's config options, though it held the
    # session already).
    assert list(reply["result"]) == ["configOptions"] and replayed == []

    reply = await typist.prompt(session_id, "/notool two windows")
    assert list(reply["result"]) == ["messageId"]
    # The typist's answer comes before its own user_message, then the turn follows.
    assert "user_message" not in [
        u["update"]["sessionUpdate"] for u in messages_before(typist, reply)
    ]
    for client in (typist, watcher):
        await client.until_idle(session_id)
        assert client.states(session_id) == ["running", "idle:end_turn"]
    assert typist.updates(session_id)[-len(watcher.updates(session_id)) :] == watcher.updates(
        session_id
    )
    assert watcher.texts(session_id) == "You said: /notool two windows"
    for client in (typist, watcher):
        await client.close()


async def test_a_prompt_while_one_runs_is_queued_and_cancel_ends_the_running_turn(
    url: str,
) -> None:
    client = await CheckedClient.open(url, 2)
    session_id = await client.new()
    assert (await client.prompt(session_id, "/slow 50"))["result"]["messageId"]
    queued = await client.prompt(session_id, "/notool second")
    message_id = queued["result"]["messageId"]  # accepted into the session's queue
    await client.send(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
    )
    await client.until_idle(session_id, count=2, timeout=60)
    # The running turn was cancelled; the queued one then ran to its end.
    assert client.states(session_id)[-3:] == ["idle:cancelled", "running", "idle:end_turn"]
    users = [
        u for u in client.updates(session_id) if u["update"]["sessionUpdate"] == "user_message"
    ]
    assert [u["update"]["messageId"] for u in users][1:] == [message_id]
    await client.close()


async def test_a_v2_window_joining_mid_turn_is_told_the_turn_is_running(url: str) -> None:
    """Without a replay the window gets ``state_update: running`` first (the prompt that said
    so came before what it is sent); one resuming from a position inside the turn saw it."""
    typist = await CheckedClient.open(url, 2)
    session_id = await typist.new()
    assert (await typist.prompt(session_id, "/slow 8"))["result"]["messageId"]
    await typist.read_until(lambda: "agent_message_chunk" in typist.kinds(session_id))
    chunk = next(
        u
        for u in typist.updates(session_id)
        if u["update"]["sessionUpdate"] == "agent_message_chunk"
    )
    late = await CheckedClient.open(url, 2)
    _, replayed = await resume(late, session_id, "/tmp/v2")
    assert [u["update"] for u in late.updates(session_id)][:1] == [
        {"sessionUpdate": "state_update", "state": "running"}
    ]
    assert replayed[:1] == late.updates(session_id)[:1]
    later = await CheckedClient.open(url, 2)
    cursor = {"type": REPLAY_POSITION, **position(chunk)}
    _, replayed = await resume(later, session_id, "/tmp/v2", replayFrom=cursor)
    assert replayed[0] == chunk
    for client in (typist, late, later):
        await client.until_idle(session_id)
        assert client.states(session_id)[-1] == "idle:end_turn"
    # Once the turn is over, a window joining is told nothing about a turn.
    idle = await CheckedClient.open(url, 2)
    _, replayed = await resume(idle, session_id, "/tmp/v2")
    assert replayed == []
    for client in (typist, late, later, idle):
        await client.close()


# -- replay -----------------------------------------------------------------------------------


async def test_replay_from_start_and_from_a_position_equals_the_live_stream(url: str) -> None:
    typist = await CheckedClient.open(url, 2)
    session_id = await typist.new(cwd="/tmp/long")
    watcher = await CheckedClient.open(url, 2)
    await resume(watcher, session_id, "/tmp/long")
    assert (await typist.prompt(session_id, "/chunks 2000"))["result"]["messageId"]
    for client in (typist, watcher):
        await client.until_idle(session_id, timeout=60)
    live = typist.updates(session_id)  # the whole log, as it was streamed
    watched = watcher.updates(session_id)
    assert len(watched) > 2000 and live[-len(watched) :] == watched
    assert live[-1]["update"] == {
        "sessionUpdate": "state_update",
        "state": "idle",
        "stopReason": "end_turn",
    }

    reader = await CheckedClient.open(url, 2)
    reply, replayed = await resume(reader, session_id, "/tmp/long", replayFrom={"type": "start"})
    assert reply["result"] is not None and replayed == live

    middle = position(watched[len(watched) // 2])
    cursor = {"type": REPLAY_POSITION, **middle}
    reader = await CheckedClient.open(url, 2)
    reply, replayed = await resume(reader, session_id, "/tmp/long", replayFrom=cursor)
    assert "result" in reply
    assert replayed == [u for u in live if position(u)["seq"] >= middle["seq"]]  # inclusive
    chunk_ids = {
        u["update"]["messageId"]
        for u in live
        if u["update"]["sessionUpdate"] == "agent_message_chunk"
    }
    assert len(chunk_ids) == 1  # one agent message for the whole reply, live and replayed

    head = position(live[-1])
    caught_up = {"type": REPLAY_POSITION, "seq": head["seq"] + 1, "epoch": head["epoch"]}
    reply, replayed = await resume(reader, session_id, "/tmp/long", replayFrom=caught_up)
    assert "result" in reply and replayed == []
    for client in (typist, watcher, reader):
        await client.close()


async def test_a_replay_in_batches_is_the_same_updates_in_the_same_order(url: str) -> None:
    """A client that asks for batches (as the console does) gets the replay as batch
    arrays of the very notifications, in the very order, that another client gets one per
    frame; each is valid against the v2 schema (every client here checks)."""
    typist = await CheckedClient.open(url, 2)
    session_id = await typist.new(cwd="/tmp/batched")
    await typist.prompt(session_id, "/chunks 3000")
    await typist.until_idle(session_id, timeout=60)
    live = typist.updates(session_id)
    plain = await CheckedClient.open(url, 2)
    batched = await CheckedClient.open(url, 2, meta={BATCHED_REPLAY_META: True})
    v1 = await CheckedClient.open(url, 1, meta={BATCHED_REPLAY_META: True})  # v2 only
    replays = []
    for client in (plain, batched):
        reply, replayed = await resume(client, session_id, "/tmp/batched", replayFrom=START)
        assert "result" in reply
        replays.append(replayed)
    assert replays[0] == replays[1] == live
    assert plain.batch_sizes == [] and typist.batch_sizes == []
    assert len(batched.batch_sizes) >= 2 and sum(batched.batch_sizes) <= len(live)
    assert sum(batched.batch_sizes) > len(live) - len(batched.batch_sizes)  # few bare ones
    reply = await v1.call("session/load", {"sessionId": session_id, "cwd": "/tmp/batched"})
    assert "result" in reply and v1.batch_sizes == [] and len(v1.updates(session_id)) > 3000
    for client in (typist, plain, batched, v1):
        await client.close()


async def test_live_updates_follow_a_batched_replay_with_none_lost_or_twice(url: str) -> None:
    typist = await CheckedClient.open(url, 2)
    session_id = await typist.new(cwd="/tmp/batched")
    await typist.prompt(session_id, "/chunks 2000")
    await typist.until_idle(session_id, timeout=60)
    await typist.prompt(session_id, "/slow 8")  # 8 chunks 0.2 s apart: live during the resume
    await typist.read_until(lambda: typist.texts(session_id).count("chunk") > 2001)
    batched = await CheckedClient.open(url, 2, meta={BATCHED_REPLAY_META: True})
    reply, replayed = await resume(batched, session_id, "/tmp/batched", replayFrom=START)
    assert "result" in reply and batched.batch_sizes
    for client in (typist, batched):
        await client.until_idle(session_id, count=2)
    seqs = [position(u)["seq"] for u in batched.updates(session_id)]
    assert seqs == sorted(seqs)  # in order (an event may make two updates: one seq)
    assert batched.updates(session_id) == typist.updates(session_id)  # each once, none lost
    assert len(replayed) < len(typist.updates(session_id))  # the rest came live
    for client in (typist, batched):
        await client.close()


HEAVY = 240.0
"""Seconds the heaviest tests here may take (under pytest's 300 s): their work is megabytes
through one process, whose duration is the machine's load's."""


@pytest.mark.timeout(HEAVY + 60)
async def test_a_batched_replay_longer_than_the_queue_bound_arrives_whole(store: Any) -> None:
    """A replay in batches goes to the socket whole however long it is, as one in a frame per
    event does (the outgoing queue's bound is for live traffic a client does not keep up
    with): 12 MB of history, more than the kernel's socket buffers, through a 256 KB bound."""
    settings = make_settings(max_queue_bytes=256 * 1024, max_message_bytes=15 * 1024 * 1024)
    node = Broker(settings, redis=store)
    await node.start()
    url = f"ws://127.0.0.1:{node.port}/acp"
    try:
        # 12 MB through the agent, the log, two replays and two clients' schema checks, all
        # in this one process: 2 s alone, under 15 s beside the suite's other worker on 2 cores.
        async with asyncio.timeout(HEAVY):
            session_id = await _twelve_megabytes_of_history(node, url)
            per_event = await CheckedClient.open(url, 2)
            batched = await CheckedClient.open(url, 2, meta={BATCHED_REPLAY_META: True})
            replays = []
            for client in (per_event, batched):
                reply, replayed = await resume(
                    client, session_id, "/tmp/batched", timeout=HEAVY, replayFrom=START
                )
                assert "result" in reply, reply
                replays.append(replayed)
            assert batched.batch_sizes and not per_event.batch_sizes
            assert replays[0] == replays[1]  # the same updates, in order, each once
            assert len(batched.texts(session_id)) > 12_000_000
            assert batched.states(session_id)[-1] == "idle:end_turn"  # the whole turn
            for client in (per_event, batched):
                await client.close()
    finally:
        await node.stop()


async def _twelve_megabytes_of_history(node: Broker, url: str) -> str:
    """A session whose log holds a 12 MB turn: prompted by a client that leaves once its
    prompt is taken (no watcher reads the turn live through the node's 256 KB bound)."""
    typist = await CheckedClient.open(url, 2)
    session_id = await typist.new(cwd="/tmp/batched")
    words = " ".join(f"{i:06d}" + "x" * 100_000 for i in range(120))
    reply = await typist.call(
        "session/prompt",
        {"sessionId": session_id, "prompt": text("/notool " + words)},
        timeout=HEAVY,
    )
    assert "result" in reply, reply
    await typist.close()

    async def turn_ended() -> bool:
        snapshot = await node.log.snapshot(node.settings.tenant, session_id)
        return snapshot.prompt_id is None

    await wait_for(turn_ended, HEAVY, "the 12 MB turn's end in the log")
    return session_id


async def test_a_foreign_or_malformed_replay_position_is_invalid_params_a_lost_start_lost(
    broker: Broker, url: str
) -> None:
    client = await CheckedClient.open(url, 2)
    session_id = await client.new()
    await client.prompt(session_id, "/notool x")
    await client.until_idle(session_id)
    head = position(client.updates(session_id)[-1])
    other = await CheckedClient.open(url, 2)
    for replay_from in [
        {"type": REPLAY_POSITION, "seq": 1, "epoch": "another-log"},
        {"type": REPLAY_POSITION, "seq": head["seq"] + 2, "epoch": head["epoch"]},
        {"type": REPLAY_POSITION, "seq": 0, "epoch": head["epoch"]},
        {"type": REPLAY_POSITION, "seq": "1", "epoch": head["epoch"]},
        {"type": REPLAY_POSITION, "seq": 1},
        {"type": "message", "messageId": "m1"},
        "start",
        {},
    ]:
        reply, replayed = await resume(other, session_id, "/tmp/v2", replayFrom=replay_from)
        assert reply["error"]["code"] == -32602, (replay_from, reply)
        assert replayed == []
    # The log's start is gone (the broker never cuts it: the store dropped it, here by a
    # trim), so replaying from a position in it would leave a gap: the log was lost.
    log_key = SessionKeys(broker.settings.tenant, session_id).log
    await commands(broker.redis).xtrim(log_key, minid=f"{head['seq']}-0", approximate=False)
    stale = {"type": REPLAY_POSITION, "seq": 2, "epoch": head["epoch"]}
    reply, replayed = await resume(other, session_id, "/tmp/v2", replayFrom=stale)
    assert reply["error"]["code"] == -32002 and replayed == [], reply
    assert reply["error"]["message"] == "this session's log was lost (the store dropped it)"
    await client.close()
    await other.close()


# -- session_info_update ----------------------------------------------------------------------


async def test_session_info_updates_are_identical_for_v1_and_v2_viewers(url: str) -> None:
    v2 = await CheckedClient.open(url, 2)
    session_id = await v2.new(cwd="/tmp/info")
    v1 = await CheckedClient.open(url, 1)
    await v1.call("session/resume", {"sessionId": session_id, "cwd": "/tmp/info"})

    reply = await v2.call(
        "session/set_title", {"sessionId": session_id, "title": "Named", "_meta": {"team": "x"}}
    )
    assert reply["result"] == {"title": "Named"}
    assert not [
        u
        for u in messages_before(v2, reply)
        if u["update"]["sessionUpdate"] == "session_info_update"
    ]
    await v1.call(
        "session/set_title", {"sessionId": session_id, "title": None, "_meta": {"team": None}}
    )
    await v2.call("session/set_title", {"sessionId": session_id, "_meta": None})

    def infos(client: CheckedClient) -> list[dict[str, Any]]:
        return [
            u
            for u in client.updates(session_id)
            if u["update"]["sessionUpdate"] == "session_info_update"
        ]

    await v1.read_until(lambda: len(infos(v1)) >= 3)
    await v2.read_until(lambda: len(infos(v2)) >= 3)
    assert infos(v1) == infos(v2)
    assert [i["update"] for i in infos(v2)] == [
        {"sessionUpdate": "session_info_update", "title": "Named", "_meta": {"team": "x"}},
        {"sessionUpdate": "session_info_update", "title": None, "_meta": {"team": None}},
        {"sessionUpdate": "session_info_update", "_meta": None},
    ]
    listed = await v2.call("session/list", {"cwd": "/tmp/info"})
    [info] = listed["result"]["sessions"]
    # The session's own metadata is cleared; the broker's agent and status stay.
    assert "title" not in info and set(info["_meta"]) == {"acpBroker/agent", "acpBroker/status"}
    for client in (v1, v2):
        await client.close()


# -- close, delete ----------------------------------------------------------------------------


async def test_close_stops_updates_and_delete_hides_the_session(url: str) -> None:
    actor = await CheckedClient.open(url, 2)
    session_id = await actor.new(cwd="/tmp/gone")
    watcher = await CheckedClient.open(url, 2)
    await resume(watcher, session_id, "/tmp/gone")
    assert (await watcher.call("session/close", {"sessionId": session_id}))["result"] == {}
    await actor.prompt(session_id, "/notool after close")
    await actor.until_idle(session_id)
    assert (await watcher.call("session/list", {}))["result"]["sessions"]
    assert watcher.updates(session_id) == []

    assert (await actor.call("session/delete", {"sessionId": session_id}))["result"] == {}
    assert (await actor.call("session/delete", {"sessionId": session_id}))["result"] == {}
    listed = await actor.call("session/list", {"cwd": "/tmp/gone"})
    assert listed["result"]["sessions"] == []
    reply, _ = await resume(watcher, session_id, "/tmp/gone", replayFrom={"type": "start"})
    assert reply["error"]["code"] == -32002
    assert reply["error"]["data"] == {"sessionId": session_id}  # SessionNotFoundErrorData
    for client in (actor, watcher):
        await client.close()


# -- batches ----------------------------------------------------------------------------------


async def test_batches_follow_json_rpc(url: str) -> None:
    client = await CheckedClient.open(url, 2)
    await client.send("[]")
    empty = await client.recv()
    assert isinstance(empty, dict) and empty["error"]["code"] == -32600 and empty["id"] is None

    await client.send("[1, 2, 3]")
    invalid = await client.recv()
    assert isinstance(invalid, list) and len(invalid) == 3
    assert all(e["id"] is None and e["error"]["code"] == -32600 for e in invalid)

    cancel = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "sess_x"}}
    mixed = [
        {"jsonrpc": "2.0", "id": "a", "method": "session/list", "params": {}},
        cancel,
        {"foo": "bar"},
        {"jsonrpc": "2.0", "id": "b", "method": "no/such_method"},
    ]
    await client.send(mixed)
    replies = await client.recv()
    assert isinstance(replies, list) and len(replies) == 3
    by_id = {r["id"]: r for r in replies}
    assert "sessions" in by_id["a"]["result"]
    assert by_id[None]["error"]["code"] == -32600
    assert by_id["b"]["error"]["code"] == -32601

    # Only notifications: nothing comes back, not even an empty array.
    await client.send([cancel, {**cancel, "method": "no/such_notification"}])
    after = await client.call("session/list", {})
    assert client.received[-1] is after and isinstance(client.received[-2], list)

    v1 = await CheckedClient.open(url, 1)  # v1 has no batches: one Invalid Request
    await v1.send([{"jsonrpc": "2.0", "id": 1, "method": "session/list"}])
    refused = await v1.recv()
    assert refused["error"]["code"] == -32600 and refused["id"] is None
    for each in (client, v1):
        await each.close()


# -- a failed turn ----------------------------------------------------------------------------


async def test_a_turn_whose_agent_fails_ends_idle_with_the_error_stop_reason(url: str) -> None:
    client = await CheckedClient.open(url, 2)
    session_id = await client.new(cwd="/tmp/fails")
    reply = await client.prompt(session_id, "/crash")
    assert list(reply["result"]) == ["messageId"]  # inserted: the reply stays a success
    await client.until_idle(session_id)
    [idle] = [
        u["update"]
        for u in client.updates(session_id)
        if u["update"]["sessionUpdate"] == "state_update" and u["update"]["state"] == "idle"
    ]
    assert idle["stopReason"] == "error"  # v2's ErrorStopReason, with the JSON-RPC error
    assert idle["error"]["code"] == -32603 and "agent" in idle["error"]["message"]
    await client.close()
