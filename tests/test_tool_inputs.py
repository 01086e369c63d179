"""The session tools' inputs, declared once (``broker/front/http/tool_models.py``): how a
model checks, words and describes them; and the exact words a bad input gets from every
surface that takes them, the MCP tools (over streamable HTTP) and the REST routes, against a
broker node on a real redis-server (clients and models match on these texts)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx2 as httpx
import pytest
from mcp import Client
from pydantic import Field

from broker.errors import ApiError, invalid_argument
from broker.front.http.mcp import session_list_tool
from broker.front.http.mcp_tools import tool_set
from broker.front.http.openapi import openapi_document
from broker.front.http.tool_inputs import (
    BODY_WORDING,
    LIST_WORDING,
    TOOL_WORDING,
    InputKind,
    ToolInput,
    input_schema,
    query_parameters,
)
from broker.front.http.tool_models import CreateSession, PromptInput, SessionListInput
from broker.serve import Broker
from broker.store.client import connect

from .conftest import make_settings
from .support.client import tool_result_text


def _count(value: Any) -> int:
    if value is None:
        return 3
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid_argument(f"count must be a whole number; got {value!r}")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise invalid_argument("name must be a non-empty string")
    return value


Count = Annotated[int, InputKind(_count, {"type": "integer", "minimum": 0})]
Name = Annotated[str, InputKind(_name, {"type": "string", "minLength": 1})]


class Toy(ToolInput):
    """A tool as a new one is written: a model, its fields typed with kinds of input."""

    name: Name = Field(description="Who.")
    count: Count = Field(default=3, description="How many.")


def words(model: type[ToolInput], args: dict[str, Any], wording: Any = TOOL_WORDING) -> str:
    with pytest.raises(ApiError) as raised:
        model.parse(args, wording)
    assert raised.value.code == "invalid_argument"
    return raised.value.message


def test_a_model_checks_its_inputs_in_order_and_words_each_surface() -> None:
    assert Toy.parse({"name": "a"}) == Toy(name="a", count=3)
    assert Toy.parse({"name": "a", "count": None}).count == 3  # null: left out
    assert words(Toy, {"name": "a", "zz": 1, "b": 2}) == "unknown input 'b'; inputs: name, count"
    assert words(Toy, {"b": 1}, LIST_WORDING) == "unknown input 'b': the inputs are name, count"
    assert words(Toy, {"b": 1}, BODY_WORDING) == "unknown member 'b' (members: count, name)"
    assert words(Toy, {"count": 1}) == "name is required"
    assert words(Toy, {"name": None}) == "name is required"
    # A REST body lets the input's own check say what it wants.
    assert words(Toy, {"count": 1}, BODY_WORDING) == "name must be a non-empty string"
    # The first input that fails, in declared order; a message's braces kept as they are.
    assert words(Toy, {"name": "", "count": {}}) == "name must be a non-empty string"
    assert words(Toy, {"name": "a", "count": {"x": 1}}) == (
        "count must be a whole number; got {'x': 1}"
    )


def test_a_models_schema_is_what_its_kinds_and_fields_say() -> None:
    assert input_schema(Toy) == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "Who."},
            "count": {"type": "integer", "minimum": 0, "default": 3, "description": "How many."},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    assert query_parameters(Toy, {"count": "How many, in a query."})[1] == {
        "name": "count",
        "in": "query",
        "required": False,
        "description": "How many, in a query.",
        "schema": {"type": "integer", "minimum": 0, "default": 3},
    }


def test_every_tool_shows_its_models_schema() -> None:
    for entry in tool_set(lambda rows: []).values():
        assert entry.tool.input_schema == input_schema(entry.inputs)
    listed = session_list_tool().input_schema
    assert listed == input_schema(SessionListInput)
    # As the tool's page says: five optional inputs, limit 20 by default.
    assert list(listed["properties"]) == ["status", "kind", "q", "limit", "after"]
    assert "required" not in listed and listed["properties"]["limit"]["default"] == 20
    assert listed["properties"]["kind"]["enum"] == ["browser", "shell", "combined"]
    # The OpenAPI document says the same, from the same models.
    document = openapi_document()
    schemas = document["components"]["schemas"]
    assert schemas["CreateSession"] == input_schema(CreateSession)
    assert schemas["PromptInput"] == input_schema(PromptInput)
    parameters = document["paths"]["/v1/sessions"]["get"]["parameters"]
    assert {p["name"]: p["schema"] for p in parameters} == {
        name: {k: v for k, v in schema.items() if k != "description"}
        for name, schema in listed["properties"].items()
    }


NONE = "sess_" + "0" * 32
RULE = "('sess_' and 32 lowercase hex digits)"
WAIT = "wait must be a number of seconds from 0 to 600"
LIST_INPUTS = "the inputs are status, kind, q, limit, after"
STATUSES = "status is RUNNING, STOPPED, DELETED or ERROR, or several of them joined with commas"
CREATE_INPUTS = "inputs: cwd, agent, title, userMetadata, prompt, wait, operationId"
CREATE_MEMBERS = "members: agent, cwd, prompt, title, userMetadata, wait"

MCP_TEXTS: list[tuple[str, dict[str, Any], str]] = [
    ("session_create", {}, "invalid_argument: cwd is required"),
    ("session_create", {"cwd": None}, "invalid_argument: cwd is required"),
    (
        "session_create",
        {"cwd": "/a", "colour": "red", "blue": 1},
        f"invalid_argument: unknown input 'blue'; {CREATE_INPUTS}",
    ),
    ("session_create", {"cwd": "relative"}, "invalid_argument: cwd must be an absolute path"),
    ("session_create", {"cwd": 5}, "invalid_argument: cwd must be an absolute path"),
    (
        "session_create",
        {"cwd": "/a/../b"},
        "invalid_argument: cwd must not hold a '..' component",
    ),
    (
        "session_create",
        {"cwd": "/a//b"},
        "invalid_argument: cwd must be a normalized path (no '.' component, no '//')",
    ),
    (
        "session_create",
        {"cwd": "/a", "userMetadata": "x"},
        "invalid_argument: userMetadata must be an object",
    ),
    ("session_create", {"cwd": "/a", "title": 5}, "invalid_argument: title must be a string"),
    (
        "session_create",
        {"cwd": "/a", "agent": 5},
        "invalid_argument: agent must be the name of a configured agent",
    ),
    (
        "session_create",
        {"cwd": "/a", "agent": "nobody"},
        "invalid_argument: unknown agent 'nobody'; configured: demo, plain",
    ),
    (
        "session_create",
        {"cwd": "/a", "prompt": " "},
        "invalid_argument: prompt must be a non-empty string",
    ),
    ("session_create", {"cwd": "/a", "wait": -1}, f"invalid_argument: {WAIT}"),
    ("session_create", {"cwd": "/a", "wait": True}, f"invalid_argument: {WAIT}"),
    ("session_create", {"cwd": "/a", "wait": "5"}, f"invalid_argument: {WAIT}"),
    ("session_prompt", {"id": NONE}, "invalid_argument: text is required"),
    ("session_prompt", {"text": "x"}, "invalid_argument: id is required"),
    (
        "session_prompt",
        {"id": "nope", "text": "x"},
        f"invalid_argument: id is not a session id of this broker {RULE}",
    ),
    (
        "session_prompt",
        {"id": "", "text": "x"},
        "invalid_argument: id must be a session id (a non-empty string)",
    ),
    (
        "session_prompt",
        {"id": 5, "text": "x"},
        "invalid_argument: id must be a session id (a non-empty string)",
    ),
    (
        "session_prompt",
        {"id": NONE, "text": ""},
        "invalid_argument: text must be a non-empty string",
    ),
    ("session_prompt", {"id": NONE, "text": "x", "wait": 601}, f"invalid_argument: {WAIT}"),
    (
        "session_prompt",
        {"id": NONE, "text": "x", "what": 1},
        "invalid_argument: unknown input 'what'; inputs: id, text, wait, operationId",
    ),
    ("session_prompt", {"id": NONE, "text": "x"}, f"session_not_found: no session {NONE}"),
    ("session_stop", {}, "invalid_argument: id is required"),
    (
        "session_cancel",
        {"id": NONE, "x": 1},
        "invalid_argument: unknown input 'x'; inputs: id, activityId, operationId",
    ),
    (
        "session_delete",
        {"id": "nope"},
        f"invalid_argument: id is not a session id of this broker {RULE}",
    ),
    ("session_resume", {"id": None}, "invalid_argument: id is required"),
    (
        "session_list",
        {"colour": "red"},
        f"invalid_argument: unknown input 'colour': {LIST_INPUTS}",
    ),
    (
        "session_list",
        {"limit": 0},
        "invalid_argument: limit must be an integer from 1 to 100; got 0",
    ),
    (
        "session_list",
        {"limit": True},
        "invalid_argument: limit must be an integer from 1 to 100; got True",
    ),
    (
        "session_list",
        {"limit": 2.5},
        "invalid_argument: limit must be an integer from 1 to 100; got 2.5",
    ),
    (
        "session_list",
        {"status": "FINISHED"},
        f"invalid_argument: unknown status 'FINISHED': {STATUSES}",
    ),
    ("session_list", {"status": 5}, "invalid_argument: status must be a string"),
    (
        "session_list",
        {"kind": "car"},
        "invalid_argument: unknown kind 'car': kind is browser, shell or combined",
    ),
    ("session_list", {"q": "x" * 201}, "invalid_argument: q must be at most 200 characters"),
    ("session_list", {"after": 5}, "invalid_argument: after must be a string"),
]


@pytest.fixture
async def node(redis_url: str) -> AsyncIterator[Broker]:
    """A broker (front, agent host, projector) on a private redis-server."""
    store = connect(redis_url)
    broker = Broker(make_settings(), redis=store)
    await broker.start()
    yield broker
    await broker.stop()
    await store.aclose()


async def test_mcp_tools_word_each_bad_input_as_before(node: Broker) -> None:
    seen = []
    async with Client(f"http://127.0.0.1:{node.http_port}/mcp") as client:
        for name, arguments, _ in MCP_TEXTS:
            result = await client.call_tool(name, arguments)
            seen.append((name, arguments, bool(result.is_error), tool_result_text(result)))
    assert seen == [(name, arguments, True, text) for name, arguments, text in MCP_TEXTS]


REST_TEXTS: list[tuple[str, str, Any, int, str]] = [
    ("GET", "/v1/sessions?limit=0", None, 400, "limit must be an integer from 1 to 100; got '0'"),
    (
        "GET",
        "/v1/sessions?limit=%C2%B2",
        None,
        400,
        "limit must be an integer from 1 to 100; got '²'",
    ),
    ("GET", "/v1/sessions?sort=asc", None, 400, f"unknown input 'sort': {LIST_INPUTS}"),
    (
        "GET",
        "/v1/sessions?status=RUNNING,nope",
        None,
        400,
        f"unknown status 'NOPE': {STATUSES}",
    ),
    (
        "GET",
        "/v1/sessions?status=RUNNING&status=STOPPED",
        None,
        400,
        "status is given more than once (join several statuses with commas)",
    ),
    ("POST", "/v1/sessions", {}, 400, "cwd must be an absolute path"),
    ("POST", "/v1/sessions", {"cwd": None}, 400, "cwd must be an absolute path"),
    (
        "POST",
        "/v1/sessions",
        {"cwd": "/a", "colour": 1},
        400,
        f"unknown member 'colour' ({CREATE_MEMBERS})",
    ),
    ("POST", "/v1/sessions", [], 400, "the request body must be a JSON object"),
    ("POST", "/v1/sessions", b"", 400, "the request needs a JSON object body"),
    ("POST", "/v1/sessions", b"{", 400, "the request body must be JSON"),
    (
        "POST",
        "/v1/sessions",
        {"cwd": "/a", "prompt": ""},
        400,
        "prompt must be a non-empty string",
    ),
    ("POST", "/v1/sessions", {"cwd": "/a", "wait": 700}, 400, WAIT),
    ("POST", f"/v1/sessions/{NONE}/prompt", {}, 400, "text must be a non-empty string"),
    ("POST", f"/v1/sessions/{NONE}/prompt", b"", 400, "the request needs a JSON object body"),
    (
        "POST",
        f"/v1/sessions/{NONE}/prompt",
        {"text": "x", "id": 1},
        400,
        "unknown member 'id' (members: text, wait)",
    ),
    ("POST", f"/v1/sessions/{NONE}/prompt", {"text": "x", "wait": "5"}, 400, WAIT),
    ("POST", f"/v1/sessions/{NONE}/prompt", {"text": "x"}, 404, f"no session {NONE}"),
    (
        "POST",
        f"/v1/sessions/{NONE}/cancel",
        {"x": 1},
        400,
        "unknown member 'x' (members: activityId)",
    ),
    ("POST", f"/v1/sessions/{NONE}/stop", b"", 404, f"no session {NONE}"),
    ("GET", "/v1/sessions/nope", None, 400, f"id is not a session id of this broker {RULE}"),
    ("DELETE", "/v1/sessions/nope", None, 400, f"id is not a session id of this broker {RULE}"),
]


async def test_rest_routes_word_each_bad_input_as_before(node: Broker) -> None:
    seen = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}") as http:
        for method, path, body, _, _ in REST_TEXTS:
            if isinstance(body, bytes):
                answer = await http.request(method, path, content=body)
            elif body is None:
                answer = await http.request(method, path)
            else:
                answer = await http.request(method, path, json=body)
            problem = answer.json()
            seen.append((method, path, body, answer.status_code, problem.get("detail")))
    assert seen == REST_TEXTS
