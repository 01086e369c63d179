"""ACP's Streamable HTTP transport on ``/acp`` of the HTTP port: POST, GET streams, DELETE,
the RFD's refusals, a prompt with a permission round trip, and resuming a stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import pytest

from broker.auth.tokens import TokenStore
from broker.serve import Broker
from broker.store.client import connect
from tests.conftest import make_settings
from tests.support.acp_http import JSON, SSE, HttpAcp, is_response
from tests.support.client import RawClient, wait_for


@pytest.fixture(params=["redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def base(broker: Broker) -> str:
    return f"http://127.0.0.1:{broker.http_port}"


@pytest.fixture
async def acp(base: str) -> AsyncIterator[HttpAcp]:
    client = HttpAcp([base])
    yield client
    await client.aclose()


def _is_permission(message: Any) -> bool:
    return isinstance(message, dict) and message.get("method") == "session/request_permission"


async def _new_session(acp: HttpAcp, conn: Any, tmp: str) -> str:
    msg_id = await acp.request("session/new", {"cwd": tmp, "mcpServers": []})
    events = await conn.until(is_response(msg_id))
    return str(events[-1][1]["result"]["sessionId"])


async def test_initialize_answers_200_with_the_connection_id(acp: HttpAcp) -> None:
    reply = await acp.initialize()
    assert reply["id"] == 0 and reply["result"]["protocolVersion"] == 1
    assert acp.conn_id


async def test_a_prompt_with_a_permission_round_trip(acp: HttpAcp, tmp_path: Any) -> None:
    await acp.initialize()
    conn = await acp.open()
    session_id = await _new_session(acp, conn, str(tmp_path))
    stream = await acp.open(session_id)
    prompt = [{"type": "text", "text": "hello"}]
    msg_id = await acp.request(
        "session/prompt", {"sessionId": session_id, "prompt": prompt}, session_id
    )
    asked = (await stream.until(_is_permission))[-1][1]
    option = asked["params"]["options"][0]["optionId"]
    answer = {
        "jsonrpc": "2.0",
        "id": asked["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": option}},
    }
    assert (await acp.post(answer, session_id)).status_code == 202
    events = await stream.until(is_response(msg_id))
    assert events[-1][1]["result"]["stopReason"] == "end_turn"
    ids = [event_id for event_id, _ in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    updates = [m for _, m in events if m.get("method") == "session/update"]
    assert any(u["params"]["update"]["sessionUpdate"] == "tool_call_update" for u in updates)


async def test_a_stream_resumes_after_its_last_event_id(acp: HttpAcp, tmp_path: Any) -> None:
    await acp.initialize()
    conn = await acp.open()
    session_id = await _new_session(acp, conn, str(tmp_path))
    stream = await acp.open(session_id)
    prompt = [{"type": "text", "text": "/chunks 30"}]
    msg_id = await acp.request(
        "session/prompt", {"sessionId": session_id, "prompt": prompt}, session_id
    )
    events = await stream.until(is_response(msg_id))
    await stream.close()
    middle = events[len(events) // 2][0]
    again = await acp.open(session_id, last_event_id=middle)
    resumed = await again.until(is_response(msg_id))
    assert resumed == [e for e in events if e[0] > middle]


async def test_refusals_as_the_rfd_says(acp: HttpAcp, base: str) -> None:
    client = acp.client
    url = base + "/acp"
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    text = json.dumps(init)
    response = await client.post(url, content=text, headers={"Content-Type": "text/plain"})
    assert response.status_code == 415
    list_request = {"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}}
    assert (await client.post(url, json=list_request)).status_code == 400
    assert (await client.post(url, json=[init])).status_code == 501
    assert (await client.post(url, content="{", headers=JSON)).status_code == 400
    assert (await client.get(url, headers=SSE)).status_code == 400
    unknown = {**SSE, "Acp-Connection-Id": "nope"}
    assert (await client.get(url, headers=unknown)).status_code == 404
    await acp.initialize()
    assert (await client.get(url, headers=acp.headers())).status_code == 406
    session_get = acp.headers("no-such-session", **SSE)
    assert (await client.get(url, headers=session_get)).status_code == 404
    huge = {"jsonrpc": "2.0", "id": 3, "method": "session/list", "params": {"x": "y" * 5_000_000}}
    assert (await acp.post(huge)).status_code == 413  # max_message_bytes: 4 MiB
    prompt = {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "x"}}
    assert (await acp.post(prompt)).status_code == 400
    assert (await acp.delete()).status_code == 202
    assert (await acp.post(list_request)).status_code == 404


async def test_credentials_on_every_request(tmp_path: Any, redis_url: str) -> None:
    store = connect(redis_url)
    node = Broker(make_settings(auth="on"), redis=store)
    await node.start()
    token, _ = await TokenStore(node.redis).create("acme", ["read", "write"])
    try:
        url = f"http://127.0.0.1:{node.http_port}/acp"
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        async with httpx.AsyncClient() as client:
            assert (await client.post(url, json=init)).status_code == 401
        acp = HttpAcp([f"http://127.0.0.1:{node.http_port}"], token=token)
        try:
            await acp.initialize()
            anonymous = {k: v for k, v in acp.headers(**SSE).items() if k != "Authorization"}
            assert (await acp.client.get(url, headers=anonymous)).status_code == 401
            conn = await acp.open()
            session_id = await _new_session(acp, conn, str(tmp_path))
            # Another tenant's credential: the connection and the session are not there.
            other_token, _ = await TokenStore(node.redis).create("globex", ["read", "write"])
            other = HttpAcp(acp.bases, token=other_token)
            try:
                await other.initialize()
                foreign = {**acp.headers(session_id, **SSE), **other.auth}
                assert (await acp.client.get(url, headers=foreign)).status_code == 404
                own_conn = other.headers(session_id, **SSE)
                assert (await other.client.get(url, headers=own_conn)).status_code == 404
                listing = {"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}}
                foreign_post = {**acp.headers(**JSON), **other.auth}
                response = await other.client.post(url, json=listing, headers=foreign_post)
                assert response.status_code == 404
            finally:
                await other.aclose()
            reader = HttpAcp(
                acp.bases, token=(await TokenStore(node.redis).create("acme", ["read"]))[0]
            )
            try:
                await reader.initialize()
                new = {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {}}
                assert (await reader.post(new)).status_code == 403
            finally:
                await reader.aclose()
        finally:
            await acp.aclose()
    finally:
        await node.stop()
        await store.aclose()


def _chunks(messages: list[Any]) -> list[str]:
    return [
        m["params"]["update"]["content"]["text"]
        for m in messages
        if m.get("method") == "session/update"
        and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]


async def test_a_websocket_window_and_an_http_client_see_each_others_turns(
    acp: HttpAcp, broker: Broker, tmp_path: Any
) -> None:
    await acp.initialize()
    conn = await acp.open()
    session_id = await _new_session(acp, conn, str(tmp_path))
    stream = await acp.open(session_id)
    window = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
    try:
        params = {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []}
        await window.call("session/load", params)
        window.inbox.clear()
        prompt = [{"type": "text", "text": "/chunks 20"}]
        msg_id = await acp.request(
            "session/prompt", {"sessionId": session_id, "prompt": prompt}, session_id
        )
        seen = [m for _, m in await stream.until(is_response(msg_id))]
        expected = [f"chunk {n}" for n in range(1, 21)]
        assert _chunks(seen) == expected
        assert await window.read_chunks(session_id, 20, 20) == expected
        # The reverse: the window's turn, on the HTTP client's stream.
        window.inbox.clear()
        await window.send_prompt(7, session_id, "/chunks 15")
        await window.reply_to(7, 20)
        watched = await stream.until(
            lambda m: (
                len(_chunks([m])) == 1 and m["params"]["update"]["content"]["text"] == "chunk 15"
            )
        )
        assert _chunks([m for _, m in watched]) == [f"chunk {n}" for n in range(1, 16)]
        assert window.chunks(session_id) == [f"chunk {n}" for n in range(1, 16)]
    finally:
        await window.close()


@contextlib.asynccontextmanager
async def _node(redis_url: str, **settings: Any) -> AsyncIterator[tuple[Broker, HttpAcp]]:
    store = connect(redis_url)
    node = Broker(make_settings(**settings), redis=store)
    await node.start()
    acp = HttpAcp([f"http://127.0.0.1:{node.http_port}"])
    try:
        yield node, acp
    finally:
        await acp.aclose()
        await node.stop()
        await store.aclose()


async def test_a_second_stream_of_a_scope_replaces_the_first(acp: HttpAcp) -> None:
    await acp.initialize()
    first = await acp.open()
    second = await acp.open()
    assert first.task is not None
    await asyncio.wait_for(asyncio.shield(first.task), 10)
    msg_id = await acp.request("session/list", {})
    assert (await second.until(is_response(msg_id)))[-1][1]["result"]["sessions"] == []
    assert first.events.empty()


async def test_a_cursor_past_what_is_kept_answers_409(redis_url: str, tmp_path: Any) -> None:
    async with _node(redis_url, http_retained_messages=16) as (_, acp):
        await acp.initialize()
        conn = await acp.open()
        session_id = await _new_session(acp, conn, str(tmp_path))
        stream = await acp.open(session_id)
        prompt = [{"type": "text", "text": "/chunks 400"}]
        msg_id = await acp.request(
            "session/prompt", {"sessionId": session_id, "prompt": prompt}, session_id
        )
        events = await stream.until(is_response(msg_id))
        await stream.close()
        headers = acp.headers(session_id, **SSE, **{"Last-Event-ID": "1"})
        response = await acp.client.get(acp.url(), headers=headers)
        assert response.status_code == 409
        assert response.json()["error"] == "cursor_gap"
        last = acp.headers(session_id, **SSE, **{"Last-Event-ID": str(events[-1][0])})
        async with acp.client.stream("GET", acp.url(), headers=last) as resumed:
            assert resumed.status_code == 200  # the newest cursor is kept


async def test_a_client_that_does_not_read_is_cut_and_others_go_on(
    redis_url: str, tmp_path: Any
) -> None:
    settings = {"http_write_timeout": 1.0, "max_message_bytes": 15 * 1024 * 1024}
    async with _node(redis_url, **settings) as (node, acp):
        await acp.initialize()
        conn = await acp.open()
        session_id = await _new_session(acp, conn, str(tmp_path))
        port = node.http_port
        # A raw socket that reads the response head and then nothing more.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(
            f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"Acp-Connection-Id: {acp.conn_id}\r\nAcp-Session-Id: {session_id}\r\n\r\n".encode()
        )
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        key = (acp.conn_id, f"s:{session_id}")
        # ~12 MB of updates: more than the kernel's socket buffers hold.
        words = " ".join(f"{i:06d}" + "x" * 100_000 for i in range(120))
        prompt = [{"type": "text", "text": "/notool " + words}]
        await acp.request("session/prompt", {"sessionId": session_id, "prompt": prompt}, session_id)
        other = HttpAcp([f"http://127.0.0.1:{port}"])
        try:
            await other.initialize()
            other_conn = await other.open()
            started = time.monotonic()
            other_session = await _new_session(other, other_conn, str(tmp_path))
            other_stream = await other.open(other_session)
            small = [{"type": "text", "text": "/chunks 20"}]
            msg_id = await other.request(
                "session/prompt", {"sessionId": other_session, "prompt": small}, other_session
            )
            await other_stream.until(is_response(msg_id))
            assert time.monotonic() - started < 15
            await wait_for(lambda: key not in node.streamable.bells, 30, "the reader cut")
        finally:
            writer.close()
            await other.aclose()


async def test_an_idle_connection_expires(redis_url: str) -> None:
    async with _node(redis_url, http_idle_timeout=1.0, http_lease=0.6) as (node, acp):
        await acp.initialize()
        assert acp.conn_id in node.streamable.here
        await wait_for(lambda: acp.conn_id not in node.streamable.here, 10, "the holder let go")
        response = await acp.post({"jsonrpc": "2.0", "id": 1, "method": "session/list"})
        assert response.status_code == 404


async def test_a_connections_requests_are_paced_as_on_websocket(redis_url: str) -> None:
    # 5 requests a second (bursts of 10): 30 requests take about 4 s, every one answered.
    async with _node(redis_url, rate_per_connection=5.0) as (_, acp):
        await acp.initialize()
        conn = await acp.open()
        started = time.monotonic()
        ids = [await acp.request("session/list", {}) for _ in range(30)]
        answered = await conn.until(is_response(ids[-1]), timeout=60)
        elapsed = time.monotonic() - started
        replies = [m for _, m in answered if "result" in m]
        assert sorted(m["id"] for m in replies) == ids
        assert elapsed >= 3.0, elapsed
