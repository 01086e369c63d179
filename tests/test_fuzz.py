"""Property-based fuzzing of what clients send: JSON-RPC frames and REST query strings.

The broker runs in a thread of its own; hypothesis drives it with a synchronous client.
Whatever arrives: no crash, no 5xx, a well-formed JSON-RPC error or result, and another
connection keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect

from broker.serve import Broker
from broker.store.client import connect as store_connect

from .conftest import make_settings

METHODS = [
    "initialize",
    "session/new",
    "session/load",
    "session/resume",
    "session/prompt",
    "session/list",
    "session/cancel",
    "session/close",
    "session/delete",
    "session/set_title",
    "session/set_mode",
    "$/cancel_request",
    "authenticate",
    "x",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", 2]), "method": st.sampled_from(METHODS)},
    optional={
        "id": st.integers() | st.text(max_size=5) | st.none() | st.booleans(),
        "params": json_values,
    },
)
frames = st.one_of(
    messages.map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=200),
    st.lists(messages, max_size=3).map(json.dumps),
)


@pytest.fixture(scope="module")
def running_broker() -> Iterator[Broker]:
    loop = asyncio.new_event_loop()
    node = Broker(make_settings(rate_per_connection=10_000), redis=store_connect(None))
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(node.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    yield node
    asyncio.run_coroutine_threadsafe(node.stop(), loop).result(30)
    asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


async def _cancel_the_rest() -> None:
    current = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


@contextlib.contextmanager
def _initialized(node: Broker) -> Iterator[Any]:
    with connect(f"ws://127.0.0.1:{node.port}/acp", open_timeout=10) as ws:
        initialize = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": 1},
        }
        ws.send(json.dumps(initialize))
        assert "result" in json.loads(ws.recv(timeout=10))
        yield ws


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(frame=frames)
def test_any_frame_gets_a_well_formed_answer_and_harms_no_one(
    running_broker: Broker, frame: str
) -> None:
    with _initialized(running_broker) as ws, _initialized(running_broker) as bystander:
        ws.send(frame)
        ws.send(json.dumps({"jsonrpc": "2.0", "id": "probe", "method": "session/list"}))
        while True:  # every reply is JSON-RPC, and the probe is still answered
            reply = json.loads(ws.recv(timeout=10))
            items = reply if isinstance(reply, list) else [reply]
            for item in items:
                assert item.get("jsonrpc") == "2.0"
                if "error" in item:
                    assert isinstance(item["error"]["code"], int)
                    assert item["error"]["code"] != -32603 or "agent" in item["error"]["message"]
            if any(item.get("id") == "probe" for item in items):
                break
        bystander.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/list"}))
        assert "result" in json.loads(bystander.recv(timeout=10))


query_values = st.text(max_size=30) | st.integers().map(str)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    params=st.dictionaries(
        st.sampled_from(["status", "kind", "q", "limit", "after", "x"]), query_values, max_size=4
    )
)
def test_any_rest_query_gets_json_and_never_a_5xx(running_broker: Broker, params: dict) -> None:
    query = urllib.parse.urlencode(params)
    url = f"http://127.0.0.1:{running_broker.http_port}/v1/sessions?{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            status, body = resp.status, json.loads(resp.read())
            assert "data" in body
    except urllib.error.HTTPError as err:
        status, body = err.code, json.loads(err.read())
        assert body["code"] in {"invalid_argument", "invalid_cursor"}
    assert status < 500
