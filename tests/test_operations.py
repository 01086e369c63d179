"""Operation ids on ACP: a mutation sent again with its ``operationId`` (another connection,
another front) is answered with its first outcome and applied once; the same id with
another input is ``operation_conflict``. Two front nodes on one real Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from mcp import Client

from broker.errors.operations import OPERATION_CONFLICT, OPERATION_OUTCOME_UNKNOWN
from broker.front.acp import turn_outcome
from broker.front.http.keyed import REST_CLIENT
from broker.front.http.tool_operations import MCP_CLIENT
from broker.protocol.jsonrpc import INVALID_REQUEST
from broker.protocol.operations import digest, fingerprint
from broker.serve import Broker
from broker.store.client import connect
from broker.store.events import EventType
from broker.store.log import SessionLog
from broker.store.operations import Claim, OperationKey, OperationLedger

from .conftest import make_settings
from .support.acp_http import JSON, HttpAcp, is_response
from .support.broker_process import broker_process
from .support.client import RawClient, text, tool_result_text, wait_for
from .support.nodes import broker_pair
from .support.roles import role_process

CWD = "/work/operations"


@pytest.fixture
async def fronts(redis_url: str) -> AsyncIterator[list[Broker]]:
    """Two broker nodes (front and agent host each) on one real Redis."""
    async with broker_pair(redis_url) as nodes:
        yield nodes


def _url(node: Broker) -> str:
    return f"ws://127.0.0.1:{node.port}/acp"


async def _client(node: Broker, instance: str = "editor-1", version: int = 1) -> RawClient:
    client = await RawClient.connect(_url(node))
    caps: dict[str, Any] = {"remote": {"core": {}}} if version == 2 else {}
    field = "clientCapabilities" if version == 1 else "capabilities"
    reply = await client.call(
        "initialize",
        {"protocolVersion": version, field: caps, "_meta": {"clientInstanceId": instance}},
    )
    assert "result" in reply, reply
    return client


async def _resumed(node: Broker, session_id: str, **kwargs: Any) -> RawClient:
    client = await _client(node, **kwargs)
    reply = await client.call(
        "session/resume", {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
    )
    assert "result" in reply, reply
    return client


def _prompt(session_id: str, words: str, op: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": text(words), "_meta": {"operationId": op}}


async def _prompts_logged(node: Broker, session_id: str) -> list[dict[str, Any]]:
    events = await SessionLog(node.redis).read(node.settings.tenant, session_id)
    return [e.body for e in events if e.type == EventType.PROMPT]


async def test_a_prompt_sent_again_on_another_front_after_its_connection_dropped_runs_once(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    first = await _client(a)
    session_id = await first.new_session(CWD)
    await first.send(
        {
            "jsonrpc": "2.0",
            "id": "p1",
            "method": "session/prompt",
            "params": _prompt(session_id, "/slow 4", "op-prompt-1"),
        }
    )
    await first.read_chunks(session_id, 1, timeout=20)
    await first.close()  # the answer is lost with the connection; the turn runs on

    second = await _resumed(b, session_id)
    retry = await second.call("session/prompt", _prompt(session_id, "/slow 4", "op-prompt-1"))
    assert retry["result"]["stopReason"] == "end_turn", retry
    assert second.chunks(session_id)[-1] == "chunk 4"  # the turn's updates came first
    # Once more, after the turn: the same outcome, from the ledger; still one turn.
    third = await _resumed(a, session_id)
    again = await third.call("session/prompt", _prompt(session_id, "/slow 4", "op-prompt-1"))
    assert again["result"] == retry["result"]
    assert len(await _prompts_logged(a, session_id)) == 1
    # The same id with another prompt: a conflict, and nothing runs.
    other = await third.call("session/prompt", _prompt(session_id, "something else", "op-prompt-1"))
    assert other["error"]["code"] == INVALID_REQUEST
    assert other["error"]["data"] == {"condition": OPERATION_CONFLICT, "retryable": False}
    assert len(await _prompts_logged(a, session_id)) == 1
    for client in (second, third):
        await client.close()


async def test_an_operation_id_belongs_to_its_client_instance(fronts: list[Broker]) -> None:
    a, b = fronts
    mine = await _client(a, instance="editor-1")
    session_id = await mine.new_session(CWD)
    reply = await mine.call("session/prompt", _prompt(session_id, "/notool one", "op-shared"))
    assert reply["result"]["stopReason"] == "end_turn"
    theirs = await _resumed(b, session_id, instance="editor-2")
    reply = await theirs.call("session/prompt", _prompt(session_id, "/notool two", "op-shared"))
    assert reply["result"]["stopReason"] == "end_turn"  # another key: it ran, no conflict
    assert [p["prompt"][0]["text"] for p in await _prompts_logged(a, session_id)] == [
        "/notool one",
        "/notool two",
    ]
    for client in (mine, theirs):
        await client.close()


async def test_a_session_new_sent_again_makes_one_session_active_where_it_was_sent(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    params = {"cwd": CWD, "mcpServers": [], "_meta": {"operationId": "op-new-1"}}
    first = await _client(a)
    made = await first.call("session/new", params)
    session_id = made["result"]["sessionId"]
    await first.close()
    second = await _client(b)
    again = await second.call("session/new", params)
    assert again["result"]["sessionId"] == session_id
    # Active on the new connection (a prompt needs no load), and the tenant has one session.
    reply = await second.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/notool hi")}
    )
    assert reply["result"]["stopReason"] == "end_turn"
    listed = await second.call("session/list", {})
    assert [s["sessionId"] for s in listed["result"]["sessions"]] == [session_id]
    # The operation id is not the session's metadata.
    snapshot = await SessionLog(a.redis).snapshot(a.settings.tenant, session_id)
    assert "operationId" not in (snapshot.meta or {})
    await second.close()


async def test_a_setting_sent_again_answers_alike_and_a_changed_one_conflicts(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    first = await _client(a)
    session_id = await first.new_session(CWD)
    params = {"sessionId": session_id, "title": "one", "_meta": {"operationId": "op-title"}}
    assert (await first.call("session/set_title", params))["result"] == {"title": "one"}
    second = await _resumed(b, session_id)
    assert (await second.call("session/set_title", params))["result"] == {"title": "one"}
    changed = await second.call("session/set_title", {**params, "title": "two"})
    assert changed["error"]["data"]["condition"] == OPERATION_CONFLICT
    for client in (first, second):
        await client.close()


async def test_a_v2_client_of_the_draft_sends_it_as_a_param(fronts: list[Broker]) -> None:
    a, b = fronts
    first = await _client(a, version=2)
    session_id = await first.new_session(CWD)
    params = {"sessionId": session_id, "prompt": text("/notool v2"), "operationId": "op-v2"}
    accepted = await first.call("session/prompt", params)
    assert "messageId" in accepted["result"], accepted
    second = await _resumed(b, session_id, version=2)
    again = await second.call("session/prompt", params)
    assert again["result"] == accepted["result"]
    await wait_for(lambda: _prompts_logged(a, session_id), what="the prompt logged")
    assert len(await _prompts_logged(a, session_id)) == 1
    # In both places with two values: refused.
    both = {**params, "_meta": {"operationId": "op-other"}}
    assert (await second.call("session/prompt", both))["error"]["code"] == -32602
    for client in (first, second):
        await client.close()


async def test_a_prompt_whose_first_request_left_no_trace_is_not_run_again(
    fronts: list[Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim whose request died before the prompt reached an agent: the retry cannot
    prove what happened, says so, and runs nothing."""
    monkeypatch.setattr(turn_outcome, "LOST_GRACE", 0.3)
    a, _ = fronts
    client = await _client(a)
    session_id = await client.new_session(CWD)
    principal = "anonymous"
    key = OperationKey(a.settings.tenant, principal, "editor-1", "op-orphan")
    ledger = OperationLedger(a.redis)
    params = _prompt(session_id, "/notool lost", "op-orphan")
    entry = await ledger.begin(key, fingerprint("session/prompt", params), lease=60)
    assert entry.claim is Claim.NEW
    await ledger.lapse(key, entry)
    reply = await client.call("session/prompt", params)
    assert reply["error"]["data"]["condition"] == OPERATION_OUTCOME_UNKNOWN
    assert await _prompts_logged(a, session_id) == []
    await client.close()


async def test_a_lapsed_claim_of_a_repeatable_mutation_is_taken_over(
    fronts: list[Broker],
) -> None:
    a, _ = fronts
    client = await _client(a)
    session_id = await client.new_session(CWD)
    params = {"sessionId": session_id, "title": "kept", "_meta": {"operationId": "op-lapsed"}}
    key = OperationKey(a.settings.tenant, "anonymous", "editor-1", "op-lapsed")
    ledger = OperationLedger(a.redis)
    entry = await ledger.begin(key, fingerprint("session/set_title", params), lease=0.2)
    retry = asyncio.ensure_future(client.call("session/set_title", params))
    # Waits for the first request while its lease holds, then runs it itself.
    reply = await asyncio.wait_for(retry, 10)
    assert reply["result"] == {"title": "kept"}
    assert (await ledger.begin(key, fingerprint("session/set_title", params), 1)).claim is (
        Claim.DONE
    )
    assert entry.claim is Claim.NEW
    await client.close()


def _base(node: Broker) -> str:
    return f"http://127.0.0.1:{node.http_port}"


async def test_rest_mutations_with_an_idempotency_key_run_once_on_either_front(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    async with (
        httpx.AsyncClient(base_url=_base(a), timeout=30) as on_a,
        httpx.AsyncClient(base_url=_base(b), timeout=30) as on_b,
    ):
        made = await on_a.post("/v1/sessions", json={"cwd": CWD})
        session_id = made.json()["id"]
        path = f"/v1/sessions/{session_id}/prompt"
        key = {"Idempotency-Key": "rest-prompt-1"}
        first = await on_a.post(path, json={"text": "/notool hey"}, headers=key)
        assert first.status_code == 200, first.text
        again = await on_b.post(path, content=b'{ "text" : "/notool hey" }', headers=key)
        assert (again.status_code, again.json()) == (200, first.json())
        assert again.headers["idempotent-replayed"] == "true"
        assert len(await _prompts_logged(a, session_id)) == 1
        other = await on_b.post(path, json={"text": "/notool else"}, headers=key)
        assert (other.status_code, other.json()["code"]) == (409, OPERATION_CONFLICT)
        assert len(await _prompts_logged(a, session_id)) == 1
        # The same key on another path is another input: a conflict too.
        stop = await on_a.post(f"/v1/sessions/{session_id}/stop", headers=key)
        assert stop.status_code == 409
        # Deleting twice under one key: the first answer, twice.
        gone = {"Idempotency-Key": "rest-delete-1"}
        assert (await on_a.delete(f"/v1/sessions/{session_id}", headers=gone)).status_code == 204
        replay = await on_b.delete(f"/v1/sessions/{session_id}", headers=gone)
        assert replay.status_code == 204 and replay.headers["idempotent-replayed"] == "true"
        bad = await on_a.delete(f"/v1/sessions/{session_id}", headers={"Idempotency-Key": ""})
        assert bad.status_code == 400


async def test_a_rest_prompt_whose_first_request_died_is_not_run_again(
    fronts: list[Broker],
) -> None:
    a, _ = fronts
    async with httpx.AsyncClient(base_url=_base(a), timeout=30) as http:
        session_id = (await http.post("/v1/sessions", json={"cwd": CWD})).json()["id"]
        path = f"/v1/sessions/{session_id}/prompt"
        ledger = OperationLedger(a.redis)
        key = OperationKey(a.settings.tenant, "", REST_CLIENT, "rest-orphan")
        body = {"method": "POST", "path": path, "body": {"text": "/notool lost"}}
        entry = await ledger.begin(key, digest(body), lease=60)
        await ledger.lapse(key, entry)
        reply = await http.post(
            path, json={"text": "/notool lost"}, headers={"Idempotency-Key": "rest-orphan"}
        )
        assert (reply.status_code, reply.json()["code"]) == (409, OPERATION_OUTCOME_UNKNOWN)
        assert await _prompts_logged(a, session_id) == []


async def test_a_prompt_sent_again_after_its_front_was_killed_runs_once(
    redis_url: str, tmp_path: Path
) -> None:
    """The deploy case: the front that took the prompt dies (SIGKILL) mid-turn; the client
    sends the prompt again, same operation id, through another front: it gets the turn's
    real end, and the agent ran it once."""
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            role_process("agent-host", redis_url, tmp_path / "host.log")
        )
        fronts = [
            await stack.enter_async_context(
                broker_process(
                    redis_url, log_path=tmp_path / f"front{i}.log", extra_args=("--no-workers",)
                )
            )
            for i in range(2)
        ]
        first = await RawClient.connect(fronts[0].url)
        await first.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        session_id = await first.new_session(CWD)
        params = _prompt(session_id, "/slow 6", "op-killed")
        await first.send({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": params})
        await first.read_chunks(session_id, 2, timeout=20)
        await fronts[0].kill()
        second = await RawClient.connect(fronts[1].url)
        await second.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        resumed = await second.call(
            "session/resume", {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
        )
        assert "result" in resumed, resumed
        retry = await second.call("session/prompt", params)
        assert retry["result"]["stopReason"] == "end_turn", retry
        assert second.chunks(session_id)[-1] == "chunk 6"
        store = connect(redis_url)
        try:
            events = await SessionLog(store).read("default", session_id)
        finally:
            await store.aclose()
        assert len([e for e in events if e.type == EventType.PROMPT]) == 1
        await second.close()


async def test_operation_ids_hold_on_a_streamable_http_connection_moving_between_fronts(
    fronts: list[Broker],
) -> None:
    """The requests of one Streamable HTTP connection go to either front (the one holding
    the connection runs them): a session/new sent again under its operation id answers the
    first one's session, and one session is made. (The connection's record keeps its client
    instance, so a front taking a connection over keeps the scope of its operation ids.)"""
    acp = HttpAcp([_base(node) for node in fronts])
    try:
        body = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": 1,
                "clientCapabilities": {},
                "_meta": {"clientInstanceId": "http-editor"},
            },
        }
        response = await acp.client.post(acp.url(), json=body, headers=acp.headers(**JSON))
        assert response.status_code == 200, response.text
        acp.conn_id = response.headers["Acp-Connection-Id"]
        stream = await acp.open()
        params = {"cwd": CWD, "mcpServers": [], "_meta": {"operationId": "op-http-new"}}
        made = []
        for _ in range(2):
            msg_id = await acp.request("session/new", params)
            events = await stream.until(is_response(msg_id), timeout=60)
            made.append(events[-1][1]["result"]["sessionId"])
        assert made[0] == made[1]
        listed = await acp.client.get(_base(fronts[0]) + "/v1/sessions")
        assert [s["id"] for s in listed.json()["data"]] == [made[0]]  # one session made
    finally:
        await acp.aclose()


async def _tool(client: Client, name: str, arguments: dict[str, Any]) -> tuple[bool, str]:
    result = await client.call_tool(name, arguments)
    return bool(result.is_error), tool_result_text(result)


async def test_mcp_mutation_tools_with_an_operation_id_run_once_on_either_front(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    async with (
        Client(f"{_base(a)}/mcp") as on_a,
        Client(f"{_base(b)}/mcp") as on_b,
    ):
        made = {"cwd": CWD, "operationId": "mcp-create-1"}
        error, first = await _tool(on_a, "session_create", made)
        assert not error, first
        assert await _tool(on_b, "session_create", made) == (False, first)
        session_id = first.split()[0]
        asked = {"id": session_id, "text": "/notool hey", "operationId": "mcp-prompt-1"}
        error, turn = await _tool(on_a, "session_prompt", asked)
        assert not error and "stop reason: end_turn" in turn, turn
        # Keys' order is no input; the retry is answered with the first result, not run.
        retried = dict(reversed(asked.items()))
        assert await _tool(on_b, "session_prompt", retried) == (False, turn)
        assert len(await _prompts_logged(a, session_id)) == 1
        error, conflict = await _tool(on_b, "session_prompt", {**asked, "text": "/notool else"})
        assert error and conflict.startswith(f"{OPERATION_CONFLICT}: "), conflict
        assert len(await _prompts_logged(a, session_id)) == 1
        # A refusal is an outcome too: the stopped session's prompt, retried once resumed,
        # is answered as it first was.
        stop = {"id": session_id, "operationId": "mcp-stop-1"}
        assert not (await _tool(on_a, "session_stop", stop))[0]
        late = {"id": session_id, "text": "/notool late", "operationId": "mcp-prompt-2"}
        error, refused = await _tool(on_a, "session_prompt", late)
        assert error and refused.startswith("session_not_running: "), refused
        assert not (await _tool(on_b, "session_resume", {"id": session_id}))[0]
        assert await _tool(on_b, "session_prompt", late) == (True, refused)
        assert len(await _prompts_logged(a, session_id)) == 1
        error, bad = await _tool(on_a, "session_cancel", {"id": session_id, "operationId": ""})
        assert error and bad.startswith("invalid_argument: operationId"), bad


async def test_an_mcp_prompt_whose_first_call_died_is_not_run_again(
    fronts: list[Broker],
) -> None:
    a, _ = fronts
    async with Client(f"{_base(a)}/mcp") as client:
        error, made = await _tool(client, "session_create", {"cwd": CWD})
        assert not error, made
        session_id = made.split()[0]
        asked = {"id": session_id, "text": "/notool lost", "operationId": "mcp-orphan"}
        ledger = OperationLedger(a.redis)
        key = OperationKey(a.settings.tenant, "anonymous", MCP_CLIENT, "mcp-orphan")
        entry = await ledger.begin(key, fingerprint("tools/call session_prompt", asked), lease=60)
        await ledger.lapse(key, entry)
        error, unknown = await _tool(client, "session_prompt", asked)
        assert error and unknown.startswith(f"{OPERATION_OUTCOME_UNKNOWN}: "), unknown
        assert await _prompts_logged(a, session_id) == []


async def test_a_key_retried_past_the_window_is_outcome_unknown(redis_url: str) -> None:
    """A short window (1 s): a retry within it is answered; one past it finds the key's
    tombstone and is ``operation_outcome_unknown``; nothing runs twice."""
    node = Broker(
        make_settings(operation_retention=1.0, operation_tombstone=60.0), redis=connect(redis_url)
    )
    await node.start()
    try:
        async with httpx.AsyncClient(base_url=_base(node), timeout=30) as http:
            session_id = (await http.post("/v1/sessions", json={"cwd": CWD})).json()["id"]
            path = f"/v1/sessions/{session_id}/prompt"
            key = {"Idempotency-Key": "short-window"}
            first = await http.post(path, json={"text": "/notool once"}, headers=key)
            assert first.status_code == 200, first.text
            record = OperationKey(node.settings.tenant, "", REST_CLIENT, "short-window")

            async def expired() -> bool:
                return not await node.redis.exists(record.name)

            await wait_for(expired, 15, what="the window passed")  # 1 s, on busy cores
            late = await http.post(path, json={"text": "/notool once"}, headers=key)
            assert (late.status_code, late.json()["code"]) == (409, OPERATION_OUTCOME_UNKNOWN)
            assert len(await _prompts_logged(node, session_id)) == 1
    finally:
        await node.stop()
        await node.redis.aclose()
