"""The session tools (MCP over HTTP and stdio) and their REST routes, as clients use them,
beside a WebSocket ACP client watching the same session."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from broker.config import AgentSpec
from broker.front.http.turns import QUEUED
from broker.serve import Broker
from broker.store.client import connect

from .conftest import ROOT, make_settings, subprocess_env
from .support.client import RawClient, tool_result_text, wait_for

LINE = re.compile(
    r"^(?P<id>sess_[0-9a-f]{32})  (?P<status>RUNNING|STOPPED|DELETED|ERROR) *  "
    r"(?P<kind>browser|shell|combined) *  (?P<created>\S+Z)$"
)
TOOLS = {
    "session_list",
    "session_create",
    "session_resume",
    "session_prompt",
    "session_cancel",
    "session_stop",
    "session_delete",
    "interaction_list",
    "interaction_respond",
    "session_presence",
}
ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}


@pytest.fixture
async def node(redis_url: str) -> AsyncIterator[Broker]:
    """A broker (front, agent host, projector) on a private redis-server."""
    store = connect(redis_url)
    broker = Broker(make_settings(), redis=store)
    await broker.start()
    yield broker
    await broker.stop()
    await store.aclose()


def mcp_url(node: Broker) -> str:
    return f"http://127.0.0.1:{node.http_port}/mcp"


def base(node: Broker) -> str:
    return f"http://127.0.0.1:{node.http_port}"


async def call(client: Client, name: str, arguments: dict[str, Any]) -> tuple[bool, str]:
    result = await client.call_tool(name, arguments)
    return bool(result.is_error), tool_result_text(result)


async def ok(client: Client, name: str, arguments: dict[str, Any]) -> str:
    error, text = await call(client, name, arguments)
    assert not error, text
    return text


def id_of(text: str) -> str:
    match = LINE.match(text.split("\n")[0])
    assert match is not None, text
    return match["id"]


def status_of(text: str) -> str:
    match = LINE.match(text.split("\n")[0])
    assert match is not None, text
    return match["status"]


async def watcher(node: Broker, session_id: str, cwd: str) -> RawClient:
    """A WebSocket ACP client with the session open (loaded: its history replayed)."""
    ws = await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp")
    reply = await ws.call("session/load", {"sessionId": session_id, "cwd": cwd, "mcpServers": []})
    assert "result" in reply, reply
    return ws


def asks(ws: RawClient) -> list[dict[str, Any]]:
    return [m for m in ws.inbox if m.get("method") == "session/request_permission"]


# -- MCP ------------------------------------------------------------------------------------


async def test_the_tools_are_listed_with_truthful_annotations(node: Broker) -> None:
    async with Client(mcp_url(node)) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.title and tool.annotations is not None
        assert tool.annotations.title == tool.title
    hints = {
        name: (
            t.annotations.read_only_hint,
            t.annotations.destructive_hint,
            t.annotations.idempotent_hint,
            t.annotations.open_world_hint,
        )
        for name, t in tools.items()
        if t.annotations is not None
    }
    assert hints["session_delete"][1:3] == (True, True)
    assert hints["session_prompt"][0] is False and hints["session_prompt"][3] is True
    assert hints["session_create"][0] is False and hints["session_create"][3] is True
    assert hints["session_list"][0] is True
    assert tools["session_prompt"].input_schema["required"] == ["id", "text"]
    assert tools["session_prompt"].input_schema["properties"]["wait"]["maximum"] == 600


async def test_a_tool_driven_turn_is_live_in_a_websocket_window(node: Broker) -> None:
    async with Client(mcp_url(node)) as client:
        created = await ok(client, "session_create", {"cwd": "/srv/tools", "title": "by a tool"})
        session_id = id_of(created)
        live = created.split("\n")[1]
        assert status_of(created) == "RUNNING"
        assert live == f"live view: {base(node)}/sessions/{session_id}"
        ws = await watcher(node, session_id, "/srv/tools")

        reply = await ok(client, "session_prompt", {"id": session_id, "text": "/notool hi there"})
        *text, last = reply.split("\n")
        assert last == "stop reason: end_turn"
        assert "\n".join(text) == "You said: /notool hi there"
        # The window saw the turn live: the same chunks, in order.
        await ws.read_until(lambda: "".join(ws.chunks(session_id)) == "\n".join(text))

        # A turn that asks a person: the window gets the question; the tool says so.
        asking = asyncio.ensure_future(
            call(client, "session_prompt", {"id": session_id, "text": "read it", "wait": 30})
        )
        await ws.read_until(lambda: asks(ws))
        error, waiting = await asking
        assert not error, waiting
        assert waiting.endswith("still running")
        assert f"live view: {base(node)}/sessions/{session_id}" in waiting
        assert "waiting for a person" in waiting and "tool call: Read README.md" in waiting
        await ws.send({"jsonrpc": "2.0", "id": asks(ws)[0]["id"], "result": ALLOW})
        listed = await ok(client, "session_list", {"q": session_id})
        assert status_of(listed) == "RUNNING"
        await ws.close()


async def test_busy_cancel_stop_resume_and_delete(node: Broker) -> None:
    assert node.worker is not None
    async with Client(mcp_url(node)) as client:
        session_id = id_of(await ok(client, "session_create", {"cwd": "/srv/b"}))
        running = await ok(
            client, "session_prompt", {"id": session_id, "text": "/slow 50", "wait": 1}
        )
        assert running.split("\n")[-1] == "still running" and "chunk 1" in running
        # A prompt while a turn runs waits its turn in the session's queue.
        queued = await ok(
            client, "session_prompt", {"id": session_id, "text": "/notool again", "wait": 0.5}
        )
        assert queued.split("\n")[-1] == QUEUED
        assert await ok(client, "session_cancel", {"id": session_id}) == "stop reason: cancelled"

        async def both_ended() -> bool:  # the queued turn ran once the cancelled one ended
            events = await node.log.read(node.settings.tenant, session_id)
            return len([e for e in events if e.type == "prompt_end"]) == 2

        await wait_for(both_ended, 30, "the queued turn's end")
        assert await ok(client, "session_cancel", {"id": session_id}) == "no turn was running"

        assert node.worker.host.holds(session_id)
        stopped = await ok(client, "session_stop", {"id": session_id})
        assert status_of(stopped) == "STOPPED" and "\n" not in stopped
        assert not node.worker.host.holds(session_id)  # its agent process let it go
        assert await ok(client, "session_stop", {"id": session_id}) == stopped
        error, refused = await call(client, "session_prompt", {"id": session_id, "text": "x"})
        assert error and refused.startswith("session_not_running: ")
        assert "session_resume" in refused
        resumed = await ok(client, "session_resume", {"id": session_id})
        assert status_of(resumed) == "RUNNING" and resumed.endswith(f"/sessions/{session_id}")
        assert node.worker.host.holds(session_id)
        assert await ok(client, "session_resume", {"id": session_id}) == resumed  # a no-op
        again = await ok(client, "session_prompt", {"id": session_id, "text": "/notool back"})
        assert again.endswith("stop reason: end_turn")

        deleted = await ok(client, "session_delete", {"id": session_id})
        assert status_of(deleted) == "DELETED"
        assert await ok(client, "session_delete", {"id": session_id}) == deleted
        assert status_of(await ok(client, "session_list", {"q": session_id})) == "DELETED"
        error, gone = await call(client, "session_prompt", {"id": session_id, "text": "x"})
        assert error and gone.startswith("session_not_found: ")


MCP_ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("session_prompt", {"id": "sess_" + "0" * 32, "text": "x"}, "session_not_found"),
    ("session_delete", {"id": "sess_" + "0" * 32}, "session_not_found"),
    ("session_resume", {"id": "nope"}, "invalid_argument"),
    ("session_prompt", {"id": "sess_" + "0" * 32, "text": "x", "wait": 601}, "invalid_argument"),
    ("session_prompt", {"id": "sess_" + "0" * 32}, "invalid_argument"),
    ("session_create", {"cwd": "relative"}, "invalid_argument"),
    ("session_create", {"cwd": "/a", "agent": "nobody"}, "invalid_argument"),
    ("session_create", {"cwd": "/a", "colour": "red"}, "invalid_argument"),
    ("session_stop", {}, "invalid_argument"),
]


async def test_bad_calls_are_error_results_naming_the_code(node: Broker) -> None:
    async with Client(mcp_url(node)) as client:
        for name, arguments, code in MCP_ERRORS:
            error, text = await call(client, name, arguments)
            assert error and text.startswith(f"{code}: "), (name, arguments, text)
            assert "\n" not in text


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


async def test_a_tool_call_an_agent_never_answers_is_failed_within_its_deadline(
    redis_url: str, tmp_path: Path
) -> None:
    """An agent that starts and never speaks: the host takes the command and goes quiet
    (its own bound on the agent is a minute); the MCP caller is told ``unavailable`` once
    the request deadline (2 s) has passed, not left waiting. The broker stopped while the
    agent is still starting leaves no process of it behind."""
    pids = tmp_path / "pids"
    pids.mkdir()
    # Leaves its pid where the test finds it, then waits for a signal, saying nothing.
    pid_file = f"{pids}/{{os.getpid()}}"
    speechless = f"import os, signal; open(f{pid_file!r}, 'w'); signal.pause()"
    mute = AgentSpec(name="mute", command=[sys.executable, "-c", speechless])
    store = connect(redis_url)
    broker = Broker(make_settings(agents=[mute], request_timeout=2.0), redis=store)
    await broker.start()
    try:
        async with Client(mcp_url(broker)) as client:
            loop = asyncio.get_running_loop()
            started = loop.time()
            error, text = await asyncio.wait_for(
                call(client, "session_create", {"cwd": "/tmp/mute"}), 60
            )
            assert error and text.startswith("unavailable: "), text
            # The deadline and a loaded machine's scheduling: well under the agent's minute.
            assert loop.time() - started < 30
    finally:
        await broker.stop()
        await store.aclose()
    started_pids = [int(path.name) for path in pids.iterdir()]
    assert started_pids  # the session's agent (and the host's start-up check) ran
    await wait_for(
        lambda: not any(running(pid) for pid in started_pids), 10.0, "the mute agents to end"
    )


def stdio_server(redis_url: str, tmp_path: Path) -> StdioServerParameters:
    config = tmp_path / "broker.toml"
    agent = [sys.executable, "-m", "broker.demo.agent"]
    config.write_text(
        f"cursor_secret = 'test-secret'\npublic_url = 'https://broker.example'\n"
        f"[[agents]]\nname = 'demo'\ncommand = {json.dumps(agent)}\n"
        "env = { ACP_DEMO_TEST_COMMANDS = '1', ACP_DEMO_CHUNK_DELAY = '0' }\n"
    )
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "broker.cli", "mcp", "--redis-url", redis_url, "--config", str(config)],
        cwd=str(ROOT),
        env={"PYTHONPATH": subprocess_env()["PYTHONPATH"]},
    )


async def test_stdio_drives_the_agents_of_a_running_deployment(
    redis_url: str, tmp_path: Path
) -> None:
    store = connect(redis_url)
    node = Broker(make_settings(), redis=store)
    await node.start()
    try:
        async with Client(stdio_server(redis_url, tmp_path)) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            created = await ok(
                client, "session_create", {"cwd": "/srv/s", "prompt": "/notool over stdio"}
            )
            lines = created.split("\n")
            session_id = id_of(created)
            assert lines[1] == f"live view: https://broker.example/sessions/{session_id}"
            assert lines[2:] == ["You said: /notool over stdio", "stop reason: end_turn"]
        async with httpx.AsyncClient(timeout=10) as http:
            got = await http.get(f"{base(node)}/v1/sessions/{session_id}")
        assert got.status_code == 200 and got.json()["status"] == "RUNNING"
    finally:
        await node.stop()
        await store.aclose()


async def test_stdio_without_an_agent_host_says_unavailable_in_one_line(
    redis_url: str, tmp_path: Path
) -> None:
    async with Client(stdio_server(redis_url, tmp_path)) as client:
        for name, arguments in [
            ("session_create", {"cwd": "/srv/none"}),
            ("session_resume", {"id": "sess_" + "1" * 32}),
        ]:
            error, text = await call(client, name, arguments)
            if name == "session_resume":
                assert error and text.startswith("session_not_found: ")
                continue
            assert error and text.startswith("unavailable: ") and "\n" not in text, text
        error, text = await call(client, "session_list", {})
        assert not error and text == "(no sessions)"


# -- REST -----------------------------------------------------------------------------------


async def test_rest_drives_a_session_beside_a_websocket_window(node: Broker) -> None:
    async with httpx.AsyncClient(base_url=base(node), timeout=30) as http:
        body = {"cwd": "/srv/rest", "title": "scripted", "userMetadata": {"team": "red"}}
        key = {"Idempotency-Key": "create-1"}
        first = await http.post("/v1/sessions", json=body, headers=key)
        assert first.status_code == 201, first.text
        session = first.json()
        session_id = session["id"]
        assert first.headers["location"] == f"/v1/sessions/{session_id}"
        assert session["liveViewUrl"] == f"{base(node)}/sessions/{session_id}"
        assert (session["status"], session["title"]) == ("RUNNING", "scripted")
        assert session["userMetadata"] == {"team": "red"}
        retried = await http.post("/v1/sessions", json=body, headers=key)
        assert retried.status_code == 201 and retried.json()["id"] == session_id
        other = await http.post("/v1/sessions", json={"cwd": "/elsewhere"}, headers=key)
        assert other.status_code == 409 and other.json()["code"] == "operation_conflict"
        listed = (await http.get("/v1/sessions", params={"q": "red"})).json()["data"]
        assert [s["id"] for s in listed] == [session_id]

        ws = await watcher(node, session_id, "/srv/rest")
        turn = await http.post(f"/v1/sessions/{session_id}/prompt", json={"text": "/notool hey"})
        assert turn.status_code == 200, turn.text
        assert turn.json()["text"] == "You said: /notool hey"
        assert (turn.json()["state"], turn.json()["stopReason"]) == ("ended", "end_turn")
        await ws.read_until(lambda: "".join(ws.chunks(session_id)) == turn.json()["text"])

        slow = await http.post(
            f"/v1/sessions/{session_id}/prompt", json={"text": "/slow 50", "wait": 0.5}
        )
        assert slow.status_code == 202 and slow.json()["state"] == "running"
        queued = await http.post(
            f"/v1/sessions/{session_id}/prompt", json={"text": "/notool x", "wait": 0.2}
        )
        assert queued.status_code == 202 and queued.json()["state"] == "queued"
        cancelled = await http.post(f"/v1/sessions/{session_id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["stopReason"] == "cancelled"

        stopped = await http.post(f"/v1/sessions/{session_id}/stop")
        assert stopped.status_code == 200 and stopped.json()["status"] == "STOPPED"
        refused = await http.post(f"/v1/sessions/{session_id}/prompt", json={"text": "x"})
        assert refused.status_code == 409 and refused.json()["code"] == "session_not_running"
        resumed = await http.post(f"/v1/sessions/{session_id}/resume", json={})
        assert resumed.status_code == 200 and resumed.json()["status"] == "RUNNING"

        deleted = await http.delete(f"/v1/sessions/{session_id}")
        assert deleted.status_code == 204 and deleted.content == b""
        assert (await http.delete(f"/v1/sessions/{session_id}")).status_code == 204
        got = await http.get(f"/v1/sessions/{session_id}")
        assert got.status_code == 200 and got.json()["status"] == "DELETED"
        unknown = await http.get(f"/v1/sessions/sess_{'0' * 32}")
        assert unknown.status_code == 404
        assert unknown.headers["content-type"] == "application/problem+json"
        assert unknown.json()["code"] == "session_not_found"
        wrong = await http.put(f"/v1/sessions/{session_id}")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, DELETE"
        await ws.close()


async def test_a_create_with_a_first_prompt_answers_its_turn(node: Broker) -> None:
    async with httpx.AsyncClient(base_url=base(node), timeout=30) as http:
        made = await http.post("/v1/sessions", json={"cwd": "/srv/p", "prompt": "/notool first"})
        assert made.status_code == 201, made.text
        assert made.json()["turn"]["text"] == "You said: /notool first"
        assert made.json()["turn"]["stopReason"] == "end_turn"


# -- Server-Sent Events ---------------------------------------------------------------------


class SseReader:
    """Reads an SSE response's events, a few at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()
        self.comments: list[str] = []

    async def events(
        self, count: int, timeout: float = 20.0, until: str | None = None
    ) -> list[tuple[int, dict[str, Any]]]:
        """The next ``count`` events (or those up to one of type ``until``), as (id, data)."""
        events: list[tuple[int, dict[str, Any]]] = []
        fields: dict[str, str] = {}

        async def read() -> None:
            async for line in self.lines:
                if line == "":
                    if "id" in fields:
                        events.append((int(fields["id"]), json.loads(fields["data"])))
                        if len(events) == count or fields.get("event") == until:
                            return
                    fields.clear()
                elif line.startswith(":"):
                    self.comments.append(line)
                else:
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")

        await asyncio.wait_for(read(), timeout)
        return events


async def test_events_resume_with_last_event_id_losing_and_repeating_nothing(
    node: Broker,
) -> None:
    async with httpx.AsyncClient(base_url=base(node), timeout=30) as http:
        session_id = (await http.post("/v1/sessions", json={"cwd": "/srv/sse"})).json()["id"]
        url = f"/v1/sessions/{session_id}/events"
        async with http.stream("GET", url) as first:
            assert first.headers["content-type"].startswith("text/event-stream")
            reader = SseReader(first)
            history = await reader.events(2)
            turn = asyncio.ensure_future(
                http.post(f"/v1/sessions/{session_id}/prompt", json={"text": "/chunks 30"})
            )
            seen = history + await reader.events(10)
        last = seen[-1][0]
        assert [seq for seq, _ in seen] == list(range(1, last + 1))
        assert (await turn).status_code == 200
        async with http.stream("GET", url, headers={"Last-Event-ID": str(last)}) as second:
            rest = await SseReader(second).events(1000, until="prompt_end")
        seqs = [seq for seq, _ in seen + rest]
        assert seqs == list(range(1, len(seqs) + 1)), seqs
        assert rest[-1][1]["event"]["type"] == "prompt_end"
        async with http.stream("GET", f"{url}?after={last}") as third:
            again = await SseReader(third).events(len(rest))
            assert [seq for seq, _ in again] == seqs[len(seen) :]
        bad = await http.get(url, headers={"Last-Event-ID": "x"})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_argument"


async def test_event_streams_send_heartbeats(node: Broker) -> None:
    node.http.session_routes.stream.heartbeat = 0.2
    async with httpx.AsyncClient(base_url=base(node), timeout=30) as http:
        session_id = (await http.post("/v1/sessions", json={"cwd": "/srv/hb"})).json()["id"]
        async with http.stream("GET", f"/v1/sessions/{session_id}/events") as stream:

            async def heartbeat() -> None:
                async for line in stream.aiter_lines():
                    if line == ": heartbeat":
                        return

            await asyncio.wait_for(heartbeat(), 10)


# -- auth on: scopes, and schemathesis over every route -------------------------------------

MUTATING = ("post", "put", "patch", "delete")


def undocumented_keys(document: dict[str, Any]) -> list[str]:
    """The mutations of an OpenAPI document that do not document the ``Idempotency-Key``
    header, its 409s or the ``Idempotent-Replayed`` header of a replayed answer."""
    missing: list[str] = []
    for path, item in document["paths"].items():
        for method in MUTATING:
            operation = item.get(method)
            if operation is None:
                continue
            names = {p["name"].lower() for p in operation.get("parameters", [])}
            responses = operation["responses"]
            conflict = responses.get("409", {}).get("description", "")
            replayed = [
                status
                for status, answer in responses.items()
                if status.startswith("2") and "Idempotent-Replayed" in answer.get("headers", {})
            ]
            if (
                "idempotency-key" not in names
                or "operation_conflict" not in conflict
                or "operation_outcome_unknown" not in conflict
                or not replayed
            ):
                missing.append(f"{method.upper()} {path}")
    return missing


def test_every_mutation_documents_its_idempotency_key() -> None:
    from broker.front.http.openapi import openapi_document

    document = copy.deepcopy(openapi_document())
    assert undocumented_keys(document) == []
    # The check sees a mutation that leaves the header out.
    prompt = document["paths"]["/v1/sessions/{id}/prompt"]["post"]
    prompt["parameters"] = [p for p in prompt["parameters"] if p["name"] != "Idempotency-Key"]
    assert undocumented_keys(document) == ["POST /v1/sessions/{id}/prompt"]


async def test_scopes_and_every_route_against_the_openapi_document(
    redis_url: str, tmp_path: Path
) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hypothesis_settings
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    from .test_security import http_base, secured, token

    async with secured(redis_url, tmp_path) as node:
        http_url = http_base(node)
        reader = await token(redis_url, "team-a", ["read"])
        writer = await token(redis_url, "team-a", ["read", "write"])
        other = await token(redis_url, "team-b", ["read", "write"])
        async with httpx.AsyncClient(base_url=http_url, timeout=30) as http:

            def auth(credential: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {credential}"}

            made = await http.post("/v1/sessions", json={"cwd": "/srv/a"}, headers=auth(writer))
            assert made.status_code == 201, made.text
            session_id = made.json()["id"]
            assert made.json()["liveViewUrl"] == f"{http_url}/sessions/{session_id}"
            assert (await http.post("/v1/sessions", json={"cwd": "/a"})).status_code == 401
            refused = await http.post("/v1/sessions", json={"cwd": "/a"}, headers=auth(reader))
            assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
            path = f"/v1/sessions/{session_id}"
            assert (await http.get(path, headers=auth(reader))).status_code == 200
            foreign = await http.get(path, headers=auth(other))
            assert foreign.status_code == 404 and foreign.json()["code"] == "session_not_found"
            stop = await http.post(f"{path}/stop", headers=auth(reader))
            assert stop.status_code == 403
        async with (
            httpx.AsyncClient(headers=auth(reader), timeout=30) as reading,
            Client(streamable_http_client(f"{http_url}/mcp", http_client=reading)) as mcp,
        ):
            error, text = await call(mcp, "session_stop", {"id": session_id})
            assert error and text.startswith("forbidden: ") and "write" in text
            error, text = await call(mcp, "session_list", {})
            assert not error and id_of(text) == session_id

        async with httpx.AsyncClient(base_url=http_url, timeout=30) as http:
            assert undocumented_keys((await http.get("/v1/openapi.json")).json()) == []

        def run() -> list[int]:
            schema = schemathesis.openapi.from_url(f"{http_url}/v1/openapi.json")
            statuses: list[int] = []
            operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
            assert len(operations) == 15
            for operation in operations:

                @given(case=operation.as_strategy())
                @hypothesis_settings(
                    max_examples=15, deadline=None, suppress_health_check=list(HealthCheck)
                )
                def check(case: Any) -> None:
                    for credential in (None, reader, writer):
                        headers = {"Authorization": f"Bearer {credential}"} if credential else {}
                        response = case.call(base_url=http_url, headers=headers, timeout=60)
                        # A schema-valid cwd or agent may still be refused (400 says why).
                        case.validate_response(
                            response, headers=headers, excluded_checks=[positive_data_acceptance]
                        )
                        statuses.append(response.status_code)

                check()
            return statuses

        statuses = await asyncio.to_thread(run)
        assert {201, 401, 403, 404} <= set(statuses) and max(statuses) < 500, set(statuses)
