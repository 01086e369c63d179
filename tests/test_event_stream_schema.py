"""The OpenAPI document describes ``GET /v1/sessions/{id}/events``' Server-Sent Events as
they are sent (``id``, ``event``, ``data`` and the data's schema), so a validator that reads
the events (schemathesis 4) accepts a real session's stream, and refuses one that is not
so."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import pytest
import schemathesis
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import response_schema_conformance

from broker.front.http.openapi import openapi_document
from broker.serve import Broker
from broker.store.client import connect

from .conftest import make_settings

EVENTS = "/v1/sessions/{id}/events"


@pytest.fixture
async def node(redis_url: str) -> AsyncIterator[Broker]:
    store = connect(redis_url)
    broker = Broker(make_settings(), redis=store)
    await broker.start()
    yield broker
    await broker.stop()
    await store.aclose()


async def _stream_until_turn_end(http: httpx.AsyncClient, session_id: str) -> bytes:
    """The stream's bytes, from its start to the end of the session's first turn."""
    body = b""
    async with http.stream("GET", f"/v1/sessions/{session_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        async for chunk in stream.aiter_bytes():
            body += chunk
            if b"event: prompt_end\n" in body and body.endswith(b"\n\n"):
                return body
    raise AssertionError(f"the stream ended before the turn did: {body!r}")


def _validate(session_id: str, base: str, body: bytes) -> None:
    schema = schemathesis.openapi.from_dict(openapi_document())
    operation = schema[EVENTS]["GET"]
    case = operation.Case(path_parameters={"id": session_id})
    url = f"{base}/v1/sessions/{session_id}/events"
    response = httpx.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content=body,
        request=httpx.Request("GET", url),
    )
    response.elapsed = datetime.timedelta(0)  # what the stream took: not the point here
    case.validate_response(response, checks=[response_schema_conformance])


async def test_a_sessions_event_stream_is_what_the_openapi_document_says(node: Broker) -> None:
    base = f"http://127.0.0.1:{node.http_port}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        made = await http.post("/v1/sessions", json={"cwd": "/srv/sse-schema"})
        session_id = made.json()["id"]
        turn = await http.post(f"/v1/sessions/{session_id}/prompt", json={"text": "/chunks 3"})
        assert turn.status_code == 200, turn.text
        body = await asyncio.wait_for(_stream_until_turn_end(http, session_id), 30)
    assert body.count(b"\nevent: ") >= 5  # prompt, its chunks, the turn's end ...
    await asyncio.to_thread(_validate, session_id, base, body)
    # The document is read, not waved through: events that are not so are refused.
    for wrong in (
        b'id: 1\nevent: prompt\ndata: {"seq": 1}\n\n',  # no epoch, ts, event
        b'id: x\nevent: prompt\ndata: {"seq":1,"epoch":"e","ts":1,"event":{"type":"p"}}\n\n',
        b"event: prompt\ndata: not json\n\n",
    ):
        with pytest.raises(FailureGroup) as refused:
            await asyncio.to_thread(_validate, session_id, base, wrong)
        titles = [failure.title for failure in refused.value.exceptions]
        assert all(title.startswith("SSE event") for title in titles), titles


def test_the_event_data_schema_is_a_component() -> None:
    document: dict[str, Any] = openapi_document()
    content = document["paths"][EVENTS]["get"]["responses"]["200"]["content"]
    event = content["text/event-stream"]["schema"]
    assert event["required"] == ["id", "event", "data"]
    assert event["properties"]["data"]["contentSchema"] == {
        "$ref": "#/components/schemas/SessionEvent"
    }
    assert document["components"]["schemas"]["SessionEvent"]["required"] == [
        "seq",
        "epoch",
        "ts",
        "event",
    ]
