"""GET /v1/sessions and the session_list MCP tool, as clients use them."""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import jsonschema
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from broker.auth.credentials import Credentials, unauthorized
from broker.auth.principal import Principal, anonymous
from broker.serve import Broker
from broker.store.client import connect

from .conftest import ROOT, make_settings, subprocess_env
from .support.client import RawClient, tool_result_text, wait_for
from .support.nodes import asked_of_the_cache, invalidations
from .support.seed import BASE_MS, newest_first, seed_many, seed_session

LINE = re.compile(
    r"^(?P<id>\S+)  (?P<status>RUNNING|STOPPED|DELETED|ERROR) *  "
    r"(?P<kind>browser|shell|combined) *  (?P<created>\S+Z)$"
)
AFTER = re.compile(r'^after "(?P<cursor>[^"]+)"$')
STATUSES = ("RUNNING", "STOPPED", "DELETED", "ERROR")
KINDS = ("browser", "shell", "combined")


def rest_bases(broker: Broker) -> list[str]:
    """Where the REST API is served: the HTTP port (only)."""
    return [f"http://127.0.0.1:{broker.http_port}"]


def mcp_url(broker: Broker) -> str:
    return f"http://127.0.0.1:{broker.http_port}/mcp"


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=10) as client:
        yield client


async def rest_walk(http: httpx2.AsyncClient, base: str, query: str) -> list[dict[str, Any]]:
    """Every page, following the Link header."""
    sessions: list[dict[str, Any]] = []
    target: str | None = f"/v1/sessions?{query}"
    while target is not None:
        response = await http.get(base + target)
        assert response.status_code == 200, response.text
        body = response.json()
        sessions += body["data"]
        link = response.headers.get("link")
        assert (link is None) == (body["next_cursor"] is None) == (not body["has_more"])
        target = None
        if link is not None:
            match = re.fullmatch(r'<([^>]+)>; rel="next"', link)
            assert match is not None, link
            target = match[1]
            assert target.endswith("after=" + body["next_cursor"])
    return sessions


def parse_lines(text: str) -> tuple[list[dict[str, str]], str | None]:
    """A session_list result: its session lines and the cursor of its ``after`` line."""
    lines = text.split("\n")
    cursor = None
    if (match := AFTER.match(lines[-1])) is not None:
        cursor = match["cursor"]
        lines = lines[:-1]
    if lines == ["(no sessions)"]:
        return [], cursor
    parsed = []
    for line in lines:
        match = LINE.match(line)
        assert match is not None, line
        parsed.append(match.groupdict())
    return parsed, cursor


async def mcp_walk(client: Client, arguments: dict[str, Any]) -> list[dict[str, str]]:
    """Every page of session_list, passing each ``after`` line back."""
    sessions: list[dict[str, str]] = []
    cursor = None
    while True:
        result = await client.call_tool(
            "session_list", {**arguments, **({"after": cursor} if cursor else {})}
        )
        assert not result.is_error, result.content
        lines, cursor = parse_lines(tool_result_text(result))
        sessions += lines
        if cursor is None:
            return sessions


async def tool_text(client: Client, arguments: dict[str, Any]) -> tuple[bool, str]:
    result = await client.call_tool("session_list", arguments)
    return result.is_error, tool_result_text(result)


# -- REST ---------------------------------------------------------------------------------


async def test_rest_pages_with_links_on_both_ports(
    broker: Broker, http: httpx2.AsyncClient
) -> None:
    made = await seed_many(
        broker.redis,
        7,
        lambda i: {"created_ms": BASE_MS + i // 2 * 1000, "kind": KINDS[i % 3], "meta": {"n": i}},
    )
    for base in rest_bases(broker):
        response = await http.get(f"{base}/v1/sessions?limit=3")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        body = response.json()
        assert set(body) == {"data", "has_more", "next_cursor"} and body["has_more"] is True
        first = body["data"][0]
        assert set(first) >= {"id", "status", "kind", "createdAt", "updatedAt", "userMetadata"}
        assert first["createdAt"].endswith("Z") and first["status"] == "RUNNING"
        sessions = await rest_walk(http, base, "limit=3")
        assert [s["id"] for s in sessions] == newest_first(made)
        assert {s["id"]: s["userMetadata"] for s in sessions} == {
            m.session_id: m.meta for m in made
        }
        shells = await rest_walk(http, base, "kind=shell&limit=1")
        assert [s["id"] for s in shells] == newest_first([m for m in made if m.kind == "shell"])


REST_ERRORS = [
    ("limit=0", 400, "invalid_argument"),
    ("limit=101", 400, "invalid_argument"),
    ("limit=many", 400, "invalid_argument"),
    ("status=FINISHED", 400, "invalid_argument"),
    ("status=RUNNING,nope", 400, "invalid_argument"),
    ("kind=car", 400, "invalid_argument"),
    ("sort=asc", 400, "invalid_argument"),
    ("status=RUNNING&status=STOPPED", 400, "invalid_argument"),
    ("after=not-a-cursor", 400, "invalid_cursor"),
]


async def test_rest_pages_after_the_first_are_read_ahead(
    broker: Broker, http: httpx2.AsyncClient
) -> None:
    made = await seed_many(broker.redis, 7, lambda i: {"created_ms": BASE_MS + i * 1000})
    pages = broker.methods.pages
    assert pages is not None
    await wait_for(lambda: pages.live)
    for _ in range(5):
        # The broker's projector may announce the seeded sessions late, during a walk: a
        # page read ahead across an announcement is rightly not kept. Walk again, from an
        # empty cache, until a walk crosses none.
        pages.invalidate("default")
        changes = invalidations()
        before = asked_of_the_cache()
        sessions = await rest_walk(http, rest_bases(broker)[0], "limit=2")  # back to back
        after = asked_of_the_cache()
        if invalidations() == changes:
            break
    assert [s["id"] for s in sessions] == newest_first(made)
    # the first page read as asked; the three after it read ahead (waited for, or kept)
    assert {k: after[k] - before[k] for k in after} == {"hit": 3, "miss": 1, "bypass": 0}


async def test_rest_errors_are_problem_documents(broker: Broker, http: httpx2.AsyncClient) -> None:
    for base in rest_bases(broker):
        for query, status, code in REST_ERRORS:
            response = await http.get(f"{base}/v1/sessions?{query}")
            assert response.status_code == status, query
            assert response.headers["content-type"] == "application/problem+json"
            problem = response.json()
            assert problem["code"] == code and problem["status"] == status, query
            assert problem["type"] == "about:blank" and problem["title"] and problem["detail"]


async def test_rest_unknown_paths_and_methods(broker: Broker, http: httpx2.AsyncClient) -> None:
    for base in rest_bases(broker):
        response = await http.get(f"{base}/v1/nothing")
        assert response.status_code == 404 and response.json()["code"] == "not_found"
        health = await http.get(f"{base}/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
    response = await http.put(f"http://127.0.0.1:{broker.http_port}/v1/sessions")
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"
    assert response.headers["allow"] == "GET, POST"
    response = await http.post(f"http://127.0.0.1:{broker.http_port}/v1/openapi.json")
    assert response.status_code == 405 and response.headers["allow"] == "GET"


async def test_the_websocket_port_points_http_requests_to_the_http_port(
    broker: Broker, http: httpx2.AsyncClient
) -> None:
    ws_base = f"http://127.0.0.1:{broker.port}"
    health = await http.get(f"{ws_base}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    for path in ("/v1/sessions", "/v1/openapi.json", "/mcp"):
        response = await http.get(f"{ws_base}{path}")
        assert response.status_code == 404, path
        assert f"http://127.0.0.1:{broker.http_port}{path}" in response.text


async def test_a_cursor_from_one_filter_is_refused_by_another(
    broker: Broker, http: httpx2.AsyncClient
) -> None:
    await seed_many(broker.redis, 4, lambda i: {"created_ms": BASE_MS + i, "kind": "shell"})
    base = rest_bases(broker)[0]
    cursor = (await http.get(f"{base}/v1/sessions?limit=1&kind=shell")).json()["next_cursor"]
    ok = await http.get(f"{base}/v1/sessions?limit=2&kind=shell&after={cursor}")
    assert ok.status_code == 200 and len(ok.json()["data"]) == 2
    refused = await http.get(f"{base}/v1/sessions?limit=1&kind=browser&after={cursor}")
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_cursor"


async def test_openapi_document_describes_what_the_endpoint_returns(
    broker: Broker, http: httpx2.AsyncClient
) -> None:
    await seed_session(broker.redis, meta={"a": 1})
    doc = (await http.get(f"{rest_bases(broker)[0]}/v1/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    operation = doc["paths"]["/v1/sessions"]["get"]
    params = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert set(params) == {"status", "kind", "q", "limit", "after"}
    assert params["kind"]["enum"] == list(KINDS)
    assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (1, 100)
    assert params["limit"]["default"] == 20
    assert all(s in params["status"]["pattern"] for s in STATUSES)

    def schema(name: str) -> dict[str, Any]:
        return {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}

    base = rest_bases(broker)[0]
    listing = await http.get(f"{base}/v1/sessions?limit=1")
    jsonschema.Draft202012Validator(schema("SessionList")).validate(listing.json())
    problem = await http.get(f"{base}/v1/sessions?limit=0")
    jsonschema.Draft202012Validator(schema("Problem")).validate(problem.json())


# -- MCP ----------------------------------------------------------------------------------


async def test_mcp_over_http_describes_and_answers_the_tool(broker: Broker) -> None:
    made = await seed_many(
        broker.redis,
        9,
        lambda i: {
            "created_ms": BASE_MS + i * 1000,
            "kind": KINDS[i % 3],
            "status": STATUSES[i % 4],
        },
    )
    async with Client(mcp_url(broker)) as client:
        tools = (await client.list_tools()).tools
        assert tools[0].name == "session_list"  # then the other session tools
        tool = tools[0]
        assert tool.title == "List sessions"
        assert tool.annotations is not None
        assert tool.annotations.title == "List sessions"
        assert tool.annotations.read_only_hint is True
        assert tool.annotations.destructive_hint is False
        assert tool.annotations.open_world_hint is False
        props = tool.input_schema["properties"]
        assert props["kind"]["enum"] == list(KINDS)
        assert (props["limit"]["minimum"], props["limit"]["maximum"]) == (1, 100)
        assert tool.input_schema.get("required", []) == []

        error, text = await tool_text(client, {"status": "RUNNING"})
        assert not error
        lines, cursor = parse_lines(text)
        running = [m for m in made if m.status == "RUNNING"]
        assert [line["id"] for line in lines] == newest_first(running) and cursor is None
        assert all(line["status"] == "RUNNING" for line in lines)

        sessions = await mcp_walk(client, {"limit": 2, "status": "STOPPED,DELETED"})
        assert [s["id"] for s in sessions] == newest_first(
            [m for m in made if m.status in ("STOPPED", "DELETED")]
        )
        by_id = {m.session_id: m for m in made}
        for line in await mcp_walk(client, {"limit": 4}):
            seeded = by_id[line["id"]]
            assert (line["status"], line["kind"]) == (seeded.status, seeded.kind)


MCP_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"limit": 0}, "invalid_argument"),
    ({"limit": 101}, "invalid_argument"),
    ({"status": "FINISHED"}, "invalid_argument"),
    ({"kind": "car"}, "invalid_argument"),
    ({"colour": "red"}, "invalid_argument"),
    ({"after": "forged.cursor"}, "invalid_cursor"),
]


async def test_mcp_bad_inputs_are_error_results_naming_the_code(broker: Broker) -> None:
    async with Client(mcp_url(broker)) as client:
        for arguments, code in MCP_ERRORS:
            error, text = await tool_text(client, arguments)
            assert error is True, arguments
            assert text.startswith(f"{code}: "), (arguments, text)


async def test_unauthorized_callers_are_refused_by_rest_and_mcp(
    broker: Broker, http: httpx2.AsyncClient
) -> None:
    await seed_session(broker.redis)

    async def bearer_only(credentials: Credentials) -> Principal:
        if credentials.authorization != "Bearer good":
            raise unauthorized("a valid bearer token is required")
        return anonymous("default")

    broker.http.rest.sessions.authenticate = bearer_only
    for base in rest_bases(broker):
        refused = await http.get(f"{base}/v1/sessions")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["code"] == "unauthorized"
        allowed = await http.get(f"{base}/v1/sessions", headers={"Authorization": "Bearer good"})
        assert allowed.status_code == 200 and len(allowed.json()["data"]) == 1
    async with Client(mcp_url(broker)) as client:
        error, text = await tool_text(client, {})
        assert error and text.startswith("unauthorized: ")
    good = httpx2.AsyncClient(headers={"Authorization": "Bearer good"}, timeout=10)
    async with good, Client(streamable_http_client(mcp_url(broker), http_client=good)) as client:
        error, text = await tool_text(client, {})
        assert not error and len(parse_lines(text)[0]) == 1


async def test_mcp_over_stdio_needs_no_front_node(redis_url: str) -> None:
    store = connect(redis_url)
    made = await seed_many(
        store,
        5,
        lambda i: {"created_ms": BASE_MS + i, "meta": {"team": "red" if i % 2 else "blue"}},
    )
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "broker.cli",
            "mcp",
            "--redis-url",
            redis_url,
            "--cursor-secret",
            "test-secret",
        ],
        cwd=str(ROOT),
        env={"PYTHONPATH": subprocess_env()["PYTHONPATH"]},
    )
    async with Client(server) as client:
        tools = (await client.list_tools()).tools
        annotations = tools[0].annotations
        assert tools[0].name == "session_list"
        assert annotations is not None and annotations.read_only_hint
        sessions = await mcp_walk(client, {"limit": 2})
        assert [s["id"] for s in sessions] == newest_first(made)
        red = await mcp_walk(client, {"q": "RED"})
        assert [s["id"] for s in red] == newest_first([m for m in made if m.meta["team"] == "red"])
        error, text = await tool_text(client, {"limit": 101})
        assert error and text.startswith("invalid_argument: ")
        # A cursor made here is good on any node of the deployment (same secret).
        _, text = await tool_text(client, {"limit": 2})
        cursor = parse_lines(text)[1]
    node = Broker(make_settings(), redis=store)
    await node.start()
    try:
        async with httpx2.AsyncClient(timeout=10) as http:
            base = f"http://127.0.0.1:{node.http_port}"
            page = (await http.get(f"{base}/v1/sessions?limit=3&after={cursor}")).json()
        assert [s["id"] for s in page["data"]] == newest_first(made)[2:5]
    finally:
        await node.stop()
        await store.aclose()


async def test_1000_sessions_with_equal_creation_times_over_rest_and_mcp(redis_url: str) -> None:
    store = connect(redis_url)
    node = Broker(make_settings(), redis=store)
    await node.start()
    try:
        made = await seed_many(
            store, 1000, lambda i: {"status": STATUSES[i % 4], "kind": KINDS[i % 3]}
        )
        async with httpx2.AsyncClient(timeout=10) as http:
            base = f"http://127.0.0.1:{node.http_port}"
            everything = await rest_walk(http, base, "limit=100")
            assert [s["id"] for s in everything] == newest_first(made)
            some = await rest_walk(http, base, "status=ERROR,RUNNING&kind=browser&limit=33")
            want = [m for m in made if m.status in ("ERROR", "RUNNING") and m.kind == "browser"]
            assert [s["id"] for s in some] == newest_first(want)
        async with Client(mcp_url(node)) as client:
            lines = await mcp_walk(client, {"limit": 100, "status": "DELETED,STOPPED"})
            want = [m for m in made if m.status in ("DELETED", "STOPPED")]
            assert [line["id"] for line in lines] == newest_first(want)
    finally:
        await node.stop()
        await store.aclose()


# -- agreement with ACP session/list ------------------------------------------------------


async def test_rest_and_mcp_agree_with_acp_session_list(
    broker: Broker, url: str, http: httpx2.AsyncClient
) -> None:
    client = await RawClient.initialized(url)

    async def new(cwd: str, meta: dict[str, Any] | None = None) -> str:
        params: dict[str, Any] = {"cwd": cwd, "mcpServers": []}
        if meta is not None:
            params["_meta"] = meta
        reply = await client.call("session/new", params)
        return str(reply["result"]["sessionId"])

    demo = await new("/work/a", {"ticket": "ACME-7"})
    plain = await new("/work/b", {"acpBroker/agent": "plain"})
    browser = await new("/work/c", {"acpBroker/kind": "browser", "owner": "ada"})
    gone = await new("/work/d")
    await client.call("session/set_title", {"sessionId": demo, "title": "Fix the build"})
    await client.call("session/delete", {"sessionId": gone})

    acp = (await client.call("session/list", {}))["result"]["sessions"]
    rest = (await http.get(f"{rest_bases(broker)[0]}/v1/sessions")).json()["data"]
    async with Client(mcp_url(broker)) as mcp_client:
        lines, _ = parse_lines((await tool_text(mcp_client, {}))[1])
    await client.close()

    assert [line["id"] for line in lines] == [s["id"] for s in rest]
    newest = sorted(sorted(rest, key=lambda s: s["id"]), key=lambda s: s["createdAt"], reverse=True)
    assert rest == newest and {s["id"] for s in rest} == {demo, plain, browser, gone}
    by_id = {s["id"]: s for s in rest}
    assert {s["sessionId"] for s in acp} == set(by_id) - {gone}
    for info in acp:
        row = by_id[info["sessionId"]]
        assert row["cwd"] == info["cwd"] and row["updatedAt"] == info["updatedAt"]
        assert row["title"] == info.get("title")
        meta = dict(info.get("_meta", {}))
        # session/list says the agent and status as REST does, beside the session's own.
        assert meta.pop("acpBroker/agent") == row["agent"]
        assert meta.pop("acpBroker/status") == row["status"]
        assert row["userMetadata"] == meta
    assert by_id[gone]["status"] == "DELETED"
    assert {s: by_id[s]["kind"] for s in (demo, plain, browser)} == {
        demo: "combined",
        plain: "shell",
        browser: "browser",
    }
    assert by_id[demo]["userMetadata"] == {"ticket": "ACME-7"}
    assert by_id[browser]["userMetadata"] == {"owner": "ada"}
    for line in lines:
        row = by_id[line["id"]]
        assert (line["status"], line["kind"], line["created"]) == (
            row["status"],
            row["kind"],
            row["createdAt"],
        )
    found = await rest_walk(http, rest_bases(broker)[0], "q=acme")
    assert [s["id"] for s in found] == [demo]


# -- the CLI ------------------------------------------------------------------------------


def test_cli_sessions_prints_the_same_list(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from broker.cli import main

    async def seed() -> list[Any]:
        store = connect(redis_url)
        try:
            return await seed_many(
                store,
                5,
                lambda i: {"created_ms": BASE_MS + i, "status": ("STOPPED", "ERROR")[i % 2]},
            )
        finally:
            await store.aclose()

    made = asyncio.run(seed())
    common = ["--redis-url", redis_url, "--cursor-secret", "test-secret"]
    assert main(["sessions", *common, "--status", "STOPPED", "--limit", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["SESSION", "STATUS", "KIND", "CREATED", "AGENT", "TITLE", "CWD"]
    stopped = newest_first([m for m in made if m.status == "STOPPED"])
    assert [line.split()[0] for line in out[1:3]] == stopped[:2]
    assert all(line.split()[1:3] == ["STOPPED", "combined"] for line in out[1:3])
    cursor = out[3].rsplit(" ", 1)[1]
    assert main(["sessions", *common, "--status", "STOPPED", "--after", cursor]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:]] == stopped[2:]
    assert main(["sessions", *common, "--limit", "0"]) == 2
    assert capsys.readouterr().out.startswith("acp-broker sessions: invalid_argument: ")


async def test_an_unreachable_store_is_unavailable_not_a_crash(
    broker: Broker, http: httpx2.AsyncClient
) -> None:
    from broker.front.http.sessions import CatalogPages
    from broker.store.cursors import CursorCodec
    from broker.store.query import SessionLister

    dead = connect("redis://127.0.0.1:1/0")
    sessions = broker.http.rest.sessions
    sessions.lister = SessionLister(dead, CursorCodec([b"test-secret"]))
    sessions.listing.source = CatalogPages(sessions.lister)
    try:
        for base in rest_bases(broker):
            response = await http.get(f"{base}/v1/sessions")
            assert response.status_code == 503
            assert response.json()["code"] == "unavailable"
        async with Client(mcp_url(broker)) as client:
            error, text = await tool_text(client, {})
        assert error and text.startswith("unavailable: ")
    finally:
        await dead.aclose()
