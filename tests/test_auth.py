"""Authentication, tenant isolation and limits, over real connections."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import jwt
import pytest
import websockets

from broker.auth.tokens import TokenStore
from broker.serve import Broker
from broker.store.client import connect

from .conftest import make_settings, run_cli
from .support.client import RawClient, text, tool_result_text, wait_for
from .support.redis_server import restartable_redis

JWT_SECRET = "a-test-secret-that-is-long-enough-for-hs256"


@pytest.fixture
async def secure(store: Any) -> AsyncIterator[Broker]:
    node = Broker(
        make_settings(
            auth="on",
            jwt_secret=JWT_SECRET,
            jwt_audience="acp",
            jwt_issuer="tests",
            allowed_origins=["https://app.example"],
            rate_per_connection=1000,
        ),
        redis=store,
    )
    await node.start()
    yield node
    await node.stop()


def _url(node: Broker) -> str:
    return f"ws://127.0.0.1:{node.port}/acp"


async def _token(node: Broker, tenant: str, scopes: list[str]) -> str:
    token, _ = await TokenStore(node.redis).create(tenant, scopes)
    return token


def _jwt(**claims: Any) -> str:
    base = {
        "tenant": "jwt-team",
        "sub": "u",
        "aud": "acp",
        "iss": "tests",
        "exp": int(time.time()) + 600,
    }
    return jwt.encode({**base, **claims}, JWT_SECRET, algorithm="HS256")


async def _client(node: Broker, token: str | None = None, **kwargs: Any) -> RawClient:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return await RawClient.initialized(_url(node), additional_headers=headers, **kwargs)


async def _refused(node: Broker, **kwargs: Any) -> int:
    with pytest.raises(websockets.InvalidStatus) as err:
        await websockets.connect(_url(node), **kwargs)
    return int(err.value.response.status_code)


async def test_upgrades_without_good_credentials_get_401(secure: Broker) -> None:
    token = await _token(secure, "team-a", ["read"])
    revoked = await _token(secure, "team-a", ["read"])
    await TokenStore(secure.redis).revoke(revoked.split("_")[1])
    bad = [
        None,
        "acpb_nope_nope",
        token[:-2],
        revoked,
        _jwt(exp=int(time.time()) - 3600),  # expired
        _jwt(aud="someone-else"),  # wrong audience
        jwt.encode(
            {"tenant": "x", "aud": "acp", "iss": "tests", "exp": int(time.time()) + 60},
            "forged-secret-forged-secret-forged-secret",
            algorithm="HS256",
        ),
    ]
    for credential in bad:
        headers = {"Authorization": f"Bearer {credential}"} if credential else None
        assert await _refused(secure, additional_headers=headers) == 401, credential
    # Good credentials work through a header, a subprotocol (browsers) or a cookie.
    for kwargs in (
        {"additional_headers": {"Authorization": f"Bearer {token}"}},
        {"subprotocols": [f"acp-broker.bearer.{token}"]},
        {"additional_headers": {"Cookie": f"acp_broker_token={token}"}},
        {"additional_headers": {"Authorization": f"Bearer {_jwt()}"}},
    ):
        ws = await websockets.connect(_url(secure), **kwargs)
        await ws.close()


async def test_origins_outside_the_allow_list_are_refused(secure: Broker) -> None:
    token = await _token(secure, "team-a", ["read"])
    auth = {"Authorization": f"Bearer {token}"}
    assert await _refused(secure, additional_headers=auth, origin="https://evil.example") == 403
    ws = await websockets.connect(
        _url(secure), additional_headers=auth, origin=websockets.Origin("https://app.example")
    )
    await ws.close()


METHODS: list[tuple[str, dict[str, Any]]] = [
    ("session/load", {"cwd": "/iso", "mcpServers": []}),
    ("session/resume", {"cwd": "/iso"}),
    ("session/prompt", {"prompt": text("hi")}),
    ("session/set_mode", {"modeId": "code"}),
    ("session/set_config_option", {"configId": "style", "value": "shouty"}),
    ("session/set_title", {"title": "mine now"}),
    ("session/close", {}),
]


async def test_a_foreign_session_answers_exactly_like_a_missing_one(secure: Broker) -> None:
    a = await _client(secure, await _token(secure, "team-a", ["read", "write"]))
    b = await _client(secure, await _token(secure, "team-b", ["read", "write"]))
    own = await a.new_session("/iso")
    await a.call("session/prompt", {"sessionId": own, "prompt": text("/notool secret")})
    for method, params in METHODS:
        foreign = await b.call(method, {"sessionId": own, **params})
        absent = "sess_" + "0" * 32
        missing = await b.call(method, {"sessionId": absent, **params})
        assert "error" in foreign, method
        # The same error, whose data (SessionNotFoundErrorData) echoes the id asked for.
        assert foreign["error"]["data"] == {"sessionId": own}, method
        assert missing["error"]["data"] == {"sessionId": absent}, method
        assert {**foreign["error"], "data": None} == {**missing["error"], "data": None}, method
    # Deleting it "succeeds" for b, exactly as for a missing id, and changes nothing.
    assert (await b.call("session/delete", {"sessionId": own}))["result"] == {}
    listed_a = (await a.call("session/list", {}))["result"]["sessions"]
    assert [s["sessionId"] for s in listed_a] == [own]
    assert (await b.call("session/list", {}))["result"]["sessions"] == []
    # b never saw a single event of a's session.
    assert not [m for m in b.inbox if m.get("params", {}).get("sessionId") == own]
    # a's cursors are useless to b.
    await a.call("session/new", {"cwd": "/iso", "mcpServers": []})
    secure.settings.list_page_size = 1
    cursor = (await a.call("session/list", {}))["result"]["nextCursor"]
    assert (await b.call("session/list", {"cursor": cursor}))["error"]["code"] == -32602
    for client in (a, b):
        await client.close()


async def test_a_read_only_token_can_list_and_watch_but_not_change(secure: Broker) -> None:
    writer = await _client(secure, await _token(secure, "team-a", ["read", "write"]))
    reader = await _client(secure, await _token(secure, "team-a", ["read"]))
    sid = await writer.new_session("/r")
    assert (await reader.call("session/new", {"cwd": "/r", "mcpServers": []}))["error"][
        "code"
    ] == -32000
    assert "result" in await reader.call("session/resume", {"sessionId": sid, "cwd": "/r"})
    denied = await reader.call("session/prompt", {"sessionId": sid, "prompt": text("x")})
    assert denied["error"]["code"] == -32000 and "write" in denied["error"]["message"]
    assert [
        s["sessionId"] for s in (await reader.call("session/list", {}))["result"]["sessions"]
    ] == [sid]
    for client in (writer, reader):
        await client.close()


async def test_in_band_authentication_for_clients_that_cannot_set_headers(store: Any) -> None:
    node = Broker(make_settings(auth="on", allow_in_band_auth=True), redis=store)
    await node.start()
    try:
        token = await _token(node, "team-a", ["read", "write"])
        client = await _client(node)
        assert (await client.call("session/list", {}))["error"]["code"] == -32000
        wrong = await client.call(
            "authenticate",
            {"methodId": "acp-broker-token", "_meta": {"acpBroker/token": "acpb_x_y"}},
        )
        assert wrong["error"]["code"] == -32000
        ok = await client.call(
            "authenticate", {"methodId": "acp-broker-token", "_meta": {"acpBroker/token": token}}
        )
        assert ok["result"] == {}
        assert (await client.call("session/list", {}))["result"] == {"sessions": []}
        await client.close()
    finally:
        await node.stop()


async def test_initialize_advertises_the_token_auth_method(secure: Broker) -> None:
    client = await RawClient.connect(
        _url(secure),
        additional_headers={"Authorization": f"Bearer {await _token(secure, 'a', ['read'])}"},
    )
    init = await client.initialize()
    assert init["result"]["authMethods"][0]["id"] == "acp-broker-token"
    await client.close()


async def test_rest_answers_401_and_403_as_problem_documents(secure: Broker) -> None:
    reader = await _token(secure, "team-a", ["read"])
    scopeless = _jwt(scope="")

    def get(token: str | None) -> tuple[int, dict[str, Any], str]:
        request = urllib.request.Request(f"http://127.0.0.1:{secure.http_port}/v1/sessions")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, json.loads(resp.read()), resp.headers["Content-Type"]
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()), err.headers["Content-Type"]

    status, body, kind = await asyncio.to_thread(get, None)
    assert (status, body["code"]) == (401, "unauthorized") and kind.startswith(
        "application/problem+json"
    )
    status, body, _ = await asyncio.to_thread(get, "acpb_forged_token")
    assert (status, body["code"]) == (401, "unauthorized")
    status, body, _ = await asyncio.to_thread(get, scopeless)
    assert (status, body["code"]) == (403, "forbidden")
    status, body, _ = await asyncio.to_thread(get, reader)
    assert status == 200 and body["data"] == []


async def test_a_connection_past_its_rate_is_slowed_not_refused(store: Any) -> None:
    node = Broker(make_settings(rate_per_connection=20), redis=store)
    await node.start()
    try:
        client = await _client(node)
        other = await _client(node)
        replies = [await client.call("session/list", {}) for _ in range(50)]  # burst: 40
        assert all("result" in r for r in replies), [r for r in replies if "error" in r]
        # Another connection is not affected.
        assert "result" in await other.call("session/list", {})
        for c in (client, other):
            await c.close()
    finally:
        await node.stop()


async def test_sessions_per_connection_are_bounded(store: Any) -> None:
    """At most two active: a third session/new lets the least recently used idle one go
    (tests/test_session_lru.py says more)."""
    node = Broker(make_settings(max_sessions_per_connection=2), redis=store)
    await node.start()
    try:
        client = await _client(node)
        for _ in range(3):
            assert "result" in await client.call("session/new", {"cwd": "/s", "mcpServers": []})
        [conn] = node.connections
        assert len(conn.active) == 2
        await client.close()
    finally:
        await node.stop()


QUEUE_LIMIT = 1024 * 1024


async def test_a_slow_consumer_is_cut_off_and_others_keep_going(store: Any) -> None:
    node = Broker(
        # 1 MB: room for the reading client's queue when a busy machine delays its reads
        # (it shares this loop), far under the ~24 MB the stalled one is sent.
        make_settings(max_queue_bytes=QUEUE_LIMIT, max_message_bytes=15 * 1024 * 1024),
        redis=store,
    )
    await node.start()
    try:
        actor = await _client(node)
        sid = await actor.new_session("/slow")
        # A client that stops reading while ~24 MB of updates (more than the kernel's socket
        # buffers hold) are sent to it.
        stalled = await _client(node, max_queue=1, ping_interval=None)
        await stalled.call("session/resume", {"sessionId": sid, "cwd": "/slow"})
        stalled.ws.transport.pause_reading()
        words = " ".join(f"{i:06d}" + "x" * 100_000 for i in range(120))
        reply = await actor.call(
            "session/prompt", {"sessionId": sid, "prompt": text("/notool " + words)}, timeout=120
        )
        assert reply["result"]["stopReason"] == "end_turn"
        # The actor got its whole reply; the stalled client was disconnected, not buffered.
        replies = [
            m
            for m in actor.inbox
            if m.get("method") == "session/update"
            and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        ]
        assert len(replies) >= 120
        stalled.ws.transport.resume_reading()
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(stalled.ws.recv(), 30)
        received = closed.value.rcvd
        assert received is None or received.code == 4008
        conn_queues = [c._queued_bytes for c in node.connections]
        assert all(q <= QUEUE_LIMIT + 200_000 for q in conn_queues)
        await actor.close()
    finally:
        await node.stop()


async def test_the_token_cli_creates_lists_and_revokes(redis_url: str) -> None:
    async def cli(*args: str) -> tuple[int, str, str]:
        return await run_cli("token", *args, "--redis-url", redis_url)

    code, out, err = await cli("create", "--tenant", "team-x", "--scope", "read", "--name", "ci")
    token = out.strip()
    assert code == 0 and token.startswith("acpb_") and "not shown again" in err
    code, out, _ = await cli("list")
    token_id = token.split("_")[1]
    assert f"{token_id}  team-x  read  active  ci" in out and token not in out
    assert (await cli("revoke", token_id))[0] == 0
    assert "revoked" in (await cli("list"))[1]
    assert (await cli("revoke", "nope"))[0] == 1


async def test_mcp_tool_with_real_tokens_is_tenant_scoped(secure: Broker) -> None:
    import httpx2 as httpx
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    writer = await _client(secure, await _token(secure, "team-a", ["read", "write"]))
    sid = await writer.new_session("/m")
    url = f"http://127.0.0.1:{secure.http_port}/mcp"

    async def call(token: str | None) -> tuple[bool, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            httpx.AsyncClient(headers=headers, timeout=10) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            result = await client.call_tool("session_list", {})
            return bool(result.is_error), tool_result_text(result)

    error, text_out = await call(None)
    assert error and text_out.startswith("unauthorized: ")
    error, text_out = await call(await _token(secure, "team-b", ["read"]))
    assert not error and sid not in text_out
    error, text_out = await call(await _token(secure, "team-a", ["read"]))
    assert not error and sid in text_out
    await writer.close()


async def test_connections_per_credential_are_bounded(store: Any) -> None:
    node = Broker(make_settings(auth="on", max_connections_per_token=2), redis=store)
    await node.start()
    try:
        token = await _token(node, "team-a", ["read"])
        headers = {"Authorization": f"Bearer {token}"}
        first = await websockets.connect(_url(node), additional_headers=headers)
        second = await websockets.connect(_url(node), additional_headers=headers)
        assert await _refused(node, additional_headers=headers) == 429
        await first.close()
        # A freed place can be taken again.
        await wait_for(lambda: _accepted(node, headers), what="a freed place")
        await second.close()
    finally:
        await node.stop()


async def _accepted(node: Broker, headers: dict[str, str]) -> bool:
    try:
        ws = await websockets.connect(_url(node), additional_headers=headers)
    except websockets.InvalidStatus:
        return False
    await ws.close()
    return True


async def test_secrets_never_reach_the_log(
    secure: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    token = await _token(secure, "team-a", ["read", "write"])
    client = await _client(secure, token)
    await client.call("session/new", {"cwd": "/l", "mcpServers": []})
    await client.call(
        "authenticate", {"methodId": "acp-broker-token", "_meta": {"acpBroker/token": token}}
    )
    await client.close()
    assert await _refused(secure, additional_headers={"Authorization": f"Bearer {token}x"}) == 401
    secret = token.split("_", 2)[2]
    assert secret not in caplog.text and JWT_SECRET not in caplog.text


async def test_v2_clients_log_in_with_auth_login_and_every_reply_is_schema_valid(
    store: Any,
) -> None:
    from .support.schemas import WireChecker

    node = Broker(make_settings(auth="on", allow_in_band_auth=True), redis=store)
    await node.start()
    try:
        token = await _token(node, "team-a", ["read", "write"])
        client = await RawClient.connect(_url(node))
        checker = WireChecker(2)
        params = {"protocolVersion": 2, "capabilities": {}}
        init = await client.call("initialize", params)
        checker.sending({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
        [method] = init["result"]["authMethods"]
        assert method["type"] == "agent" and method["methodId"] == "acp-broker-token"
        assert (await client.call("session/list", {}))["error"]["code"] == -32000
        login = {"methodId": "acp-broker-token", "_meta": {"acpBroker/token": token}}
        checker.sending({"jsonrpc": "2.0", "id": 1, "method": "auth/login", "params": login})
        reply = await client.call("auth/login", login)
        assert reply["result"] == {}
        listed = await client.call("session/list", {})
        assert listed["result"] == {"sessions": []}
        assert (await client.call("auth/logout", {}))["result"] == {}
        assert (await client.call("session/list", {}))["error"]["code"] == -32000
        await client.close()
    finally:
        await node.stop()


async def test_rest_answers_cors_preflights_for_allowed_origins_only(secure: Broker) -> None:
    import httpx2 as httpx

    url = f"http://127.0.0.1:{secure.http_port}/v1/sessions"
    headers = {
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization",
    }
    async with httpx.AsyncClient(timeout=10) as http:
        allowed = await http.options(url, headers={**headers, "Origin": "https://app.example"})
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        refused = await http.options(url, headers={**headers, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in refused.headers


async def test_direct_tls_serves_wss_and_https(store: Any, tmp_path: Any) -> None:
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    node = Broker(
        make_settings(tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "key.pem")),
        redis=store,
    )
    await node.start()
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
        ws = await websockets.connect(f"wss://127.0.0.1:{node.port}/acp", ssl=context)
        await ws.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": 1},
                }
            )
        )
        assert "result" in json.loads(await ws.recv())
        await ws.close()
        with pytest.raises(websockets.InvalidMessage):  # plain ws:// is not served
            await websockets.connect(f"ws://127.0.0.1:{node.port}/acp", open_timeout=5)
    finally:
        await node.stop()


async def test_rate_counting_failing_while_redis_is_away_is_logged_in_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis goes away under a credential's requests: each is served uncounted (answered,
    here with the store's error), and the failed counting is logged in one line for the
    node, no traceback, not a warning with a traceback for every request."""
    with restartable_redis(aof=False) as server:
        store = connect(server.url, timeout=1.0)
        node = Broker(make_settings(auth="on", rate_per_token=10), redis=store)
        await node.start()
        client = await _client(node, await _token(node, "team-a", ["read"]))
        try:
            caplog.set_level(logging.INFO, logger="broker.front.acp")
            server.kill()
            for _ in range(3):
                assert "error" in await client.call("session/list", {})
        finally:
            server.start()
            await client.close()
            await node.stop()
            await store.aclose()
    counting = [
        r
        for r in caplog.records
        if r.name.startswith("broker.front.acp") and "count" in r.getMessage()
    ]
    assert [r.getMessage().split(":")[0] for r in counting] == [
        "counting requests for rate_per_token failed"
    ], caplog.text
    assert counting[0].exc_info is None
