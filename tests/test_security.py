"""A hostile tenant's attempts, against a real broker process with auth on and a real Redis.

Each test is one hole of issue 15, shown closed: connection places that failed
handshakes used to keep, credentials that stayed good on open connections, tenant names
and session ids that could name another tenant's keys, secrets in agents' environments,
scopes that were not checked, viewers asked to act.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import jwt
import psutil
import pytest
import websockets

from broker.auth.tokens import TokenStore
from broker.front.acp.flow import waiting_bound
from broker.store.client import connect

from .conftest import run_cli
from .support.broker_process import BrokerProcess, broker_process
from .support.client import RawClient, text, wait_for

JWT_SECRET = "a-test-secret-that-is-long-enough-for-hs256"
MISSING = "sess_" + "0" * 32


@contextlib.asynccontextmanager
async def secured(redis_url: str, tmp_path: Path, **settings: Any) -> AsyncIterator[BrokerProcess]:
    """A broker process with auth on (API tokens and HS256 JWTs); ``settings`` are given as
    ``ACP_BROKER_*`` variables (lists as JSON)."""
    env = {
        "ACP_BROKER_AUTH": "on",
        "ACP_BROKER_JWT_SECRET": JWT_SECRET,
        "ACP_BROKER_JWT_AUDIENCE": "acp",
        "ACP_BROKER_JWT_LEEWAY": "0",
    }
    for name, value in settings.items():
        rendered = json.dumps(value) if isinstance(value, list | bool) else str(value)
        env[f"ACP_BROKER_{name.upper()}"] = rendered
    async with broker_process(redis_url, log_path=tmp_path / "broker.log", env=env) as node:
        yield node


async def token(redis_url: str, tenant: str, scopes: list[str]) -> str:
    store = connect(redis_url)
    try:
        created, _ = await TokenStore(store).create(tenant, scopes)
    finally:
        await store.aclose()
    return created


def a_jwt(**claims: Any) -> str:
    base = {"tenant": "jwt-team", "sub": "u", "aud": "acp", "exp": int(time.time()) + 600}
    return jwt.encode({**base, **claims}, JWT_SECRET, algorithm="HS256")


async def client(node: BrokerProcess, credential: str | None = None) -> RawClient:
    headers = {"Authorization": f"Bearer {credential}"} if credential else None
    conn = await RawClient.connect(node.url, additional_headers=headers)
    assert "result" in await conn.initialize()
    return conn


async def upgrade_status(node: BrokerProcess, credential: str | None) -> int:
    """101 if an upgrade with this credential is accepted (then closed), else its status."""
    headers = {"Authorization": f"Bearer {credential}"} if credential else None
    try:
        ws = await websockets.connect(node.url, additional_headers=headers, open_timeout=5)
    except websockets.InvalidStatus as exc:
        return int(exc.response.status_code)
    await ws.close()
    return 101


async def raw_http(node: BrokerProcess, request: bytes, *, read: bool = True) -> bytes:
    """Send bytes to the WebSocket port as they are; what comes back until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10) if read else b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def handshake(headers: dict[str, str]) -> bytes:
    lines = ["GET /acp HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- 1. connection places -----------------------------------------------------------------------


async def test_failed_handshakes_give_their_connection_place_back(
    redis_url: str, tmp_path: Path
) -> None:
    async with secured(
        redis_url,
        tmp_path,
        max_connections_per_token=3,
        max_connections=6,
        allow_in_band_auth=True,
    ) as node:
        credential = await token(redis_url, "team-a", ["read"])
        auth = {"Authorization": f"Bearer {credential}"}
        upgrade = {
            **auth,
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Version": "13",
        }
        for _ in range(5):
            # A plain GET (no Upgrade), a bad Sec-WebSocket-Key, one dropped mid-handshake,
            # and anonymous GETs (in-band auth is on, so they are admitted first).
            assert b" 426 " in (await raw_http(node, handshake(auth))).split(b"\r\n")[0]
            bad_key = handshake({**upgrade, "Sec-WebSocket-Key": "not base64"})
            assert b" 400 " in (await raw_http(node, bad_key)).split(b"\r\n")[0]
            key = {**upgrade, "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
            await raw_http(node, handshake(key), read=False)
            assert b" 426 " in (await raw_http(node, handshake({}))).split(b"\r\n")[0]

        # Every place came back: the credential still opens its 3, and only 3.
        async def three_accepted() -> bool:
            return await upgrade_status(node, credential) == 101

        await wait_for(three_accepted, what="the places of failed handshakes to come back")
        held = [await websockets.connect(node.url, additional_headers=auth) for _ in range(3)]
        assert await upgrade_status(node, credential) == 429
        # Anonymous sockets count against the node: 3 more fill it.
        anonymous = [await websockets.connect(node.url) for _ in range(3)]
        assert await upgrade_status(node, None) == 429
        for ws in held + anonymous:
            await ws.close()
        await wait_for(three_accepted, what="closed connections' places to come back")


# -- 2. revocation and expiry ---------------------------------------------------------------------


async def closed_with(conn: RawClient, timeout: float) -> tuple[int, str]:
    """Read until the broker closes the connection; its close code and reason."""
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await conn.recv(timeout)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def test_revoked_and_expired_credentials_are_cut_from_open_connections(
    redis_url: str, tmp_path: Path
) -> None:
    async with secured(redis_url, tmp_path, credential_check_interval=0.2) as node:
        credential = await token(redis_url, "team-a", ["read", "write"])
        by_token = await client(node, credential)
        assert "result" in await by_token.call("session/list", {})
        by_jwt = await client(node, a_jwt(exp=int(time.time()) + 2))
        assert "result" in await by_jwt.call("session/list", {})
        other = await client(node, await token(redis_url, "team-a", ["read"]))

        store = connect(redis_url)
        try:
            assert await TokenStore(store).revoke(credential.split("_")[1])
        finally:
            await store.aclose()
        assert await closed_with(by_token, 5) == (4001, "credential revoked")
        assert await closed_with(by_jwt, 10) == (4001, "credential expired")
        # A connection with a good credential stays.
        assert "result" in await other.call("session/list", {})
        assert await upgrade_status(node, credential) == 401
        await other.close()


# -- 3. tenant names and session ids --------------------------------------------------------------


async def test_tenant_names_and_session_ids_are_checked_where_they_enter(
    redis_url: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError):
        await token(redis_url, "sec:s:v", ["read"])
    code, _, err = await run_cli(
        "token", "create", "--tenant", "sec:s:v", "--scope", "read", "--redis-url", redis_url
    )
    assert code != 0 and "tenant must be" in err
    async with secured(redis_url, tmp_path) as node:
        for tenant in ("sec:s:v", "a}b", "x" * 65, "ünï", ""):
            assert await upgrade_status(node, a_jwt(tenant=tenant)) == 401, tenant
        owner = await client(node, await token(redis_url, "sec", ["read", "write"]))
        sid = await owner.new_session("/t")
        attacker = await client(node, await token(redis_url, "sec", ["read", "write"]))
        for forged in (f"v:s:{sid}", f"{sid}:log", sid.upper(), f"{sid} ", "sess_x"):
            for method, params in (
                ("session/delete", {}),
                ("session/load", {"cwd": "/t", "mcpServers": []}),
                ("session/resume", {"cwd": "/t"}),
                ("session/set_title", {"title": "x"}),
            ):
                reply = await attacker.call(method, {"sessionId": forged, **params})
                assert reply["error"]["code"] == -32602, (method, forged, reply)
        listed = (await owner.call("session/list", {}))["result"]["sessions"]
        assert [s["sessionId"] for s in listed] == [sid]
        for conn in (owner, attacker):
            await conn.close()


# -- 4. agents' environment -----------------------------------------------------------------------


def agent_environments(node: BrokerProcess) -> list[dict[str, str]]:
    """The environments of the broker's child processes (its agents)."""
    return [child.environ() for child in psutil.Process(node.pid).children(recursive=True)]


async def test_agents_get_only_the_allowed_environment(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOME_DEPLOYMENT_SECRET", "do-not-leak-me")
    monkeypatch.setenv("AGENT_NEEDS_THIS", "yes")
    allowed = ["PATH", "PYTHONPATH", "ACP_DEMO_*", "AGENT_NEEDS_*", "ACP_BROKER_*"]
    async with secured(redis_url, tmp_path, agent_env=allowed) as node:
        conn = await client(node, await token(redis_url, "team-a", ["read", "write"]))
        assert "result" in await conn.call("session/new", {"cwd": "/e", "mcpServers": []})
        envs = await wait_for(lambda: agent_environments(node), what="an agent process")
        for env in envs:
            assert "SOME_DEPLOYMENT_SECRET" not in env
            assert not [k for k in env if k.startswith("ACP_BROKER_")], env  # never, even asked
            assert JWT_SECRET not in "".join(env.values())
            assert env["AGENT_NEEDS_THIS"] == "yes" and env["ACP_DEMO_TEST_COMMANDS"] == "1"
        await conn.close()


# -- 5. scopes, and viewers ----------------------------------------------------------------------

SCOPED_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("session/list", {}, "read"),
    ("session/load", {"cwd": "/s", "mcpServers": []}, "read"),
    ("session/resume", {"cwd": "/s"}, "read"),
    ("session/new", {"cwd": "/s", "mcpServers": []}, "write"),
    ("session/fork", {"cwd": "/s"}, "write"),
    ("session/prompt", {"prompt": text("/notool hi")}, "write"),
    ("session/set_mode", {"modeId": "code"}, "write"),
    ("session/set_config_option", {"configId": "style", "value": "shouty"}, "write"),
    ("session/set_title", {"title": "t"}, "write"),
    ("session/close", {}, "write"),
    ("session/delete", {}, "write"),
]


async def test_every_method_checks_its_scope(redis_url: str, tmp_path: Path) -> None:
    async with secured(redis_url, tmp_path) as node:
        full = await client(node, await token(redis_url, "jwt-team", ["read", "write"]))
        sid = await full.new_session("/s")
        credentials = {
            "read": [await token(redis_url, "jwt-team", ["read"]), a_jwt(scope="read")],
            "write": [await token(redis_url, "jwt-team", ["write"]), a_jwt(scope="write")],
            "": [a_jwt(scope=""), a_jwt(scopes=[])],
        }
        for held, tokens in credentials.items():
            for credential in tokens:
                conn = await client(node, credential)
                for method, params, needed in SCOPED_CALLS:
                    if needed == "write" and method != "session/new" and "read" in held:
                        await conn.call("session/resume", {"sessionId": sid, "cwd": "/s"})
                    reply = await conn.call(method, {"sessionId": sid, **params})
                    if needed != held:
                        assert reply["error"]["code"] == -32000, (held, method, reply)
                        assert f"needs the {needed} scope" in reply["error"]["message"]
                    else:
                        assert reply.get("error", {}).get("code") != -32000, (held, method)
                await conn.close()
        # A JWT without any scope claim gets the documented default (jwt_default_scopes).
        unscoped = await client(node, a_jwt())
        assert "result" in await unscoped.call("session/list", {})
        assert "result" in await unscoped.call("session/new", {"cwd": "/s", "mcpServers": []})
        for conn in (full, unscoped):
            await conn.close()


async def test_a_read_only_viewer_is_never_asked_for_permission(
    redis_url: str, tmp_path: Path
) -> None:
    async with secured(redis_url, tmp_path) as node:
        writer = await token(redis_url, "team-a", ["read", "write"])
        prompter = await client(node, writer)
        sid = await prompter.new_session("/v")
        reader = await token(redis_url, "team-a", ["read"])
        viewers = [await client(node, reader) for _ in range(6)]
        for viewer in viewers:
            resumed = await viewer.call("session/resume", {"sessionId": sid, "cwd": "/v"})
            assert "result" in resumed
        helper = await client(node, writer)
        assert "result" in await helper.call("session/resume", {"sessionId": sid, "cwd": "/v"})
        # The prompter is asked first; it hangs up instead of answering, so the broker asks
        # the session's other connections: the one that may write, never the viewer.
        await prompter.send_prompt(1, sid, "read the file please")

        def asked(conn: RawClient) -> list[dict[str, Any]]:
            return [m for m in conn.inbox if m.get("method") == "session/request_permission"]

        await prompter.read_until(lambda: asked(prompter))
        await prompter.close()
        await helper.read_until(lambda: asked(helper))
        [question] = asked(helper)
        options = question["params"]["options"]
        allow = next(o for o in options if o["kind"].startswith("allow"))
        await helper.send(
            {
                "jsonrpc": "2.0",
                "id": question["id"],
                "result": {"outcome": {"outcome": "selected", "optionId": allow["optionId"]}},
            }
        )

        def tool_done() -> bool:
            return any(
                m.get("method") == "session/update"
                and m["params"]["update"].get("sessionUpdate") == "tool_call_update"
                and m["params"]["update"].get("status") == "completed"
                for m in helper.inbox
            )

        await helper.read_until(tool_done)  # the helper's answer was taken
        for viewer in viewers:
            await viewer.call("session/list", {})  # whatever came before this is in its inbox
            assert asked(viewer) == []
        for conn in (*viewers, helper):
            await conn.close()


# -- 6. in-band authentication ------------------------------------------------------------------


def login(credential: str) -> dict[str, Any]:
    return {"methodId": "acp-broker-token", "_meta": {"acpBroker/token": credential}}


async def test_in_band_logins_keep_to_the_connection_cap_and_the_guess_limit(
    redis_url: str, tmp_path: Path
) -> None:
    async with secured(
        redis_url, tmp_path, allow_in_band_auth=True, max_connections_per_token=5
    ) as node:
        credential = await token(redis_url, "team-a", ["read"])
        conns = [await client(node) for _ in range(8)]
        replies = [await conn.call("authenticate", login(credential)) for conn in conns]
        assert [r.get("result") for r in replies[:5]] == [{}] * 5
        for refused in replies[5:]:
            assert refused["error"]["code"] == -32005, refused
            assert refused["error"]["data"] == {"limit": "max_connections_per_token"}
            assert (await conns[5].call("session/list", {}))["error"]["code"] == -32000
        # A place freed by a connection that goes lets another log in.
        await conns[0].close()
        await wait_for(
            lambda: _logged_in(node, credential), what="a freed place for an in-band login"
        )
        # Guesses, sent as fast as the socket takes them: a couple are looked at, the rest
        # refused without a look (logins: 1/s a connection, bursts of 2).
        guesser = conns[6]
        for n in range(50):
            await guesser.send(
                {"jsonrpc": "2.0", "id": n, "method": "authenticate", "params": login("acpb_x_y")}
            )
        answers = sorted([await guesser.recv() for _ in range(50)], key=lambda a: a["id"])
        codes = [a["error"]["code"] for a in answers]
        assert codes.count(-32000) <= 5 and codes.count(-32005) >= 45, codes
        assert answers[-1]["error"]["data"] == {"limit": "logins"}
        for conn in conns[1:]:
            await conn.close()


async def test_connections_that_never_log_in_are_closed(redis_url: str, tmp_path: Path) -> None:
    async with secured(
        redis_url,
        tmp_path,
        allow_in_band_auth=True,
        login_timeout=0.5,
        credential_check_interval=0.2,
    ) as node:
        idle = await client(node)
        logged_in = await client(node)
        credential = await token(redis_url, "team-a", ["read"])
        assert (await logged_in.call("authenticate", login(credential)))["result"] == {}
        assert await closed_with(idle, 10) == (4001, "not authenticated in time")
        assert "result" in await logged_in.call("session/list", {})
        await logged_in.close()


async def _logged_in(node: BrokerProcess, credential: str) -> bool:
    """Whether a new connection logs in (each try on its own: logins are paced)."""
    conn = await client(node)
    try:
        return "result" in await conn.call("authenticate", login(credential))
    finally:
        await conn.close()


# -- 7. amplification and idle sockets ----------------------------------------------------------


def http_base(node: BrokerProcess) -> str:
    """The node's HTTP listener, as its ready line gives it."""
    match = re.search(r"and (http://\S+) ", "".join(node.stdout_lines))
    assert match, node.stdout_lines
    return match[1]


async def test_batches_are_bounded(redis_url: str, tmp_path: Path) -> None:
    async with secured(redis_url, tmp_path, max_batch_entries=10) as node:
        conn = await RawClient.connect(
            node.url,
            additional_headers={
                "Authorization": f"Bearer {await token(redis_url, 'team-a', ['read'])}"
            },
        )
        assert "result" in await conn.call("initialize", {"protocolVersion": 2, "capabilities": {}})

        def batch(size: int) -> list[dict[str, Any]]:
            return [
                {"jsonrpc": "2.0", "id": n, "method": "session/list", "params": {}}
                for n in range(size)
            ]

        await conn.send(batch(11))
        refused = await conn.recv()
        assert isinstance(refused, dict) and refused["id"] is None, refused
        assert refused["error"]["code"] == -32600
        assert refused["error"]["data"] == {"limit": "max_batch_entries"}
        await conn.send(batch(10))
        answered = await conn.recv()
        assert sorted(a["id"] for a in answered) == list(range(10))
        assert all("result" in a for a in answered)
        await conn.close()


async def closed_by_peer(reader: asyncio.StreamReader, within: float) -> bytes:
    """What the server sends until it closes the socket (bounded)."""
    return await asyncio.wait_for(reader.read(), within)


async def test_the_http_listener_closes_slow_and_idle_sockets(
    redis_url: str, tmp_path: Path
) -> None:
    async with secured(
        redis_url, tmp_path, http_header_timeout=1, http_keep_alive_timeout=1
    ) as node:
        host, port = http_base(node).removeprefix("http://").rsplit(":", 1)
        # Silent after connecting; a request head that trickles in; idle after a response.
        silent = await asyncio.open_connection(host, int(port))
        trickling = await asyncio.open_connection(host, int(port))
        trickling[1].write(b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n")
        kept = await asyncio.open_connection(host, int(port))
        kept[1].write(b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await closed_by_peer(silent[0], 10) == b""
        assert await closed_by_peer(trickling[0], 10) == b""
        answered = await closed_by_peer(kept[0], 10)
        assert answered.startswith(b"HTTP/1.1 200"), answered[:80]
        for _, writer in (silent, trickling, kept):
            writer.close()


# -- 8. numbers ------------------------------------------------------------------------------------


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in the broker's output: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


async def test_numbers_that_cannot_be_kept_exactly_are_refused(
    redis_url: str, tmp_path: Path
) -> None:
    async with secured(redis_url, tmp_path) as node:
        conn = await client(node, await token(redis_url, "team-a", ["read", "write"]))
        for meta in ('{"x":1e999}', '{"x":-1E+400}', '{"y":12345678901234567890123}'):
            frame = (
                '{"jsonrpc":"2.0","id":7,"method":"session/new",'
                f'"params":{{"cwd":"/n","mcpServers":[],"_meta":{meta}}}}}'
            )
            await conn.send(frame)
            raw = await asyncio.wait_for(conn.ws.recv(), 10)
            reply = strict_json(raw)
            assert reply["id"] == 7 and reply["error"]["code"] == -32602, reply
        # What is within bounds is kept exactly, and every frame out is strict JSON.
        kept = {"big": 18446744073709551615, "small": -(2**63), "f": 1e300}
        new = {"cwd": "/n", "mcpServers": [], "_meta": kept}
        await conn.send({"jsonrpc": "2.0", "id": 8, "method": "session/new", "params": new})
        raw = await asyncio.wait_for(conn.ws.recv(), 10)
        assert "result" in strict_json(raw)
        await conn.send({"jsonrpc": "2.0", "id": 9, "method": "session/list", "params": {}})
        while True:
            message = strict_json(await asyncio.wait_for(conn.ws.recv(), 10))
            if message.get("id") == 9:
                break
        [listed] = message["result"]["sessions"]
        assert listed["_meta"] == {**kept, "acpBroker/agent": "demo", "acpBroker/status": "RUNNING"}
        assert (await conn.call("session/list", {}))["result"]["sessions"] == [listed]
        assert "sessions" in strict_json(json.dumps(message["result"]))
        await conn.close()


# -- 9. logs ---------------------------------------------------------------------------------------


async def test_no_credential_reaches_the_log_even_at_debug(redis_url: str, tmp_path: Path) -> None:
    env = {
        "ACP_BROKER_AUTH": "on",
        "ACP_BROKER_JWT_SECRET": JWT_SECRET,
        "ACP_BROKER_JWT_AUDIENCE": "acp",
        "ACP_BROKER_ALLOW_IN_BAND_AUTH": "true",
    }
    log_path = tmp_path / "broker.log"
    async with broker_process(redis_url, log_path=log_path, env=env, extra_args=["-v"]) as node:
        credential = await token(redis_url, "team-a", ["read", "write"])
        bearer = a_jwt()
        # In band (a long frame: websockets' dump of it shows its tail), in the query string,
        # as a header, a subprotocol and a cookie, and refused ones.
        conn = await client(node)
        padded = login(credential)
        padded["_meta"]["pad"] = "p" * 300
        assert (await conn.call("authenticate", padded))["result"] == {}
        assert "result" in await conn.call("session/new", {"cwd": "/l", "mcpServers": []})
        await conn.close()
        query = await websockets.connect(f"{node.url}?token={credential}&jwt={bearer}")
        await query.close()
        for extra in (
            {"additional_headers": {"Authorization": f"Bearer {bearer}"}},
            {"subprotocols": [f"acp-broker.bearer.{credential}"]},
            {"additional_headers": {"Cookie": f"acp_broker_token={credential}"}},
        ):
            ws = await websockets.connect(node.url, **extra)
            await ws.close()
        assert await upgrade_status(node, credential + "x") == 401
        assert await upgrade_status(node, bearer + "x") == 401
        await wait_for(lambda: "connection closed" in node.log_text(), what="the log")
    text_out = node.log_text()
    assert " DEBUG " in text_out and "< TEXT" in text_out  # it did log at DEBUG
    secret = credential.split("_", 2)[2]
    for leak in (secret, secret[-12:], bearer, bearer.split(".")[2][-12:], JWT_SECRET):
        assert leak not in text_out, leak


# -- 10. the smaller ones ---------------------------------------------------------------------


async def test_null_ids_bad_cwds_and_the_mcp_tool_list(redis_url: str, tmp_path: Path) -> None:
    async with secured(redis_url, tmp_path) as node:
        conn = await client(node, await token(redis_url, "team-a", ["read", "write"]))
        await conn.send({"jsonrpc": "2.0", "id": None, "method": "session/list", "params": {}})
        reply = await conn.recv()
        assert reply["id"] is None and reply["error"]["code"] == -32600, reply
        for cwd in ("/../../etc", "/a/../../etc", "/tmp/x\u0000y", "/a//b", "/a/./b", "rel"):
            for method, params in (
                ("session/new", {"cwd": cwd, "mcpServers": []}),
                ("session/list", {"cwd": cwd}),
            ):
                answer = await conn.call(method, params)
                assert answer["error"]["code"] == -32602, (method, cwd, answer)
        assert (await conn.call("session/list", {}))["result"]["sessions"] == []
        await conn.close()
        await _mcp_tool_list(http_base(node), await token(redis_url, "team-a", ["read"]))


async def _mcp_tool_list(base: str, credential: str) -> None:
    import httpx2 as httpx
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    async def tools(headers: dict[str, str]) -> list[str]:
        async with (
            httpx.AsyncClient(headers=headers, timeout=10) as http,
            Client(streamable_http_client(f"{base}/mcp", http_client=http)) as mcp,
        ):
            return [tool.name for tool in (await mcp.list_tools()).tools]

    with pytest.raises(BaseExceptionGroup) as refused:  # the SDK's task group wraps it
        await tools({})
    error = refused.value
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    assert isinstance(error, MCPError) and str(error).startswith("unauthorized: "), error
    assert (await tools({"Authorization": f"Bearer {credential}"}))[0] == "session_list"


async def test_the_openapi_document_holds_with_auth_on(redis_url: str, tmp_path: Path) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hypothesis_settings
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    async with secured(redis_url, tmp_path) as node:
        base = http_base(node)
        reader = await token(redis_url, "team-a", ["read"])
        writer_only = await token(redis_url, "team-a", ["write"])
        owner = await client(node, await token(redis_url, "team-a", ["read", "write"]))
        for _ in range(3):
            await owner.call("session/new", {"cwd": "/o", "mcpServers": []})
        credentials = [None, reader, writer_only, "acpb_0_forged", a_jwt(scope="")]

        def run() -> list[int]:
            schema = schemathesis.openapi.from_url(f"{base}/v1/openapi.json")
            document = schema.raw_schema
            assert "403" in document["paths"]["/v1/sessions"]["get"]["responses"]
            assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
            operation = schema["/v1/sessions"]["GET"]
            statuses: list[int] = []

            @given(case=operation.as_strategy())
            @hypothesis_settings(
                max_examples=60, deadline=None, suppress_health_check=list(HealthCheck)
            )
            def check(case: Any) -> None:
                for credential in credentials:
                    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
                    response = case.call(base_url=base, headers=headers)
                    # An ``after`` that is schema-valid is still a forged cursor (400 says
                    # so, as documented): the one check that expects it to be taken is off.
                    case.validate_response(
                        response, headers=headers, excluded_checks=[positive_data_acceptance]
                    )
                    statuses.append(response.status_code)

            check()
            return statuses

        statuses = await asyncio.to_thread(run)
        assert {200, 401, 403} <= set(statuses) and max(statuses) < 500, set(statuses)
        await owner.close()


# -- 11. flow control -------------------------------------------------------------------------


async def replies(conn: RawClient, ids: Iterable[Any]) -> list[dict[str, Any]]:
    """The replies to these ids, in any order they come (notifications go to the inbox)."""
    wanted = set(ids)
    got: dict[Any, dict[str, Any]] = {}
    while wanted - got.keys():
        message = await conn.recv()
        if "method" not in message and message.get("id") in wanted:
            got[message["id"]] = message
        else:
            conn.inbox.append(message)
    return [got[n] for n in sorted(wanted, key=str)]


async def test_a_client_that_waits_for_replies_is_slowed_never_refused(
    redis_url: str, tmp_path: Path
) -> None:
    async with secured(
        redis_url,
        tmp_path,
        rate_per_connection=10,
        rate_per_token=1000,
        max_requests_in_flight=2,
        max_pace=0.5,
    ) as node:
        conn = await client(node, await token(redis_url, "team-a", ["read", "write"]))
        # One after another, far past the burst (20): each waits its turn, none is refused.
        for _ in range(40):
            reply = await conn.call("session/new", {"cwd": "/f", "mcpServers": []})
            assert "result" in reply, reply
        # Sent without waiting, as many as the pace lets in within max_pace (past that a
        # pipelined request is refused at once: tests/test_pipelining.py): read as fast as
        # the rate and max_requests_in_flight let them be, all answered.
        pipelined = waiting_bound(10, 0.5)
        for n in range(pipelined):
            await conn.send({"jsonrpc": "2.0", "id": n, "method": "session/list", "params": {}})
        answers = await replies(conn, range(pipelined))
        assert all("result" in a for a in answers), [a for a in answers if "error" in a]
        # What is refused: a request that finds no room in flight within max_pace.
        sids = [s["sessionId"] for s in answers[0]["result"]["sessions"][:2]]
        for n, sid in enumerate(sids):
            await conn.send_prompt(f"p{n}", sid, "/slow 10")
        refused = await conn.call("session/list", {})
        assert refused["error"]["code"] == -32005, refused
        assert refused["error"]["data"] == {"limit": "max_requests_in_flight"}
        await conn.close()


async def test_a_credential_s_rate_is_counted_across_nodes(redis_url: str, tmp_path: Path) -> None:
    settings = {"rate_per_token": 3, "max_pace": 0}  # refuse at once, to show where it is
    async with (
        secured(redis_url, tmp_path / "a", **settings) as first,
        secured(redis_url, tmp_path / "b", **settings) as second,
    ):
        credential = await token(redis_url, "team-a", ["read"])
        here, there = await client(first, credential), await client(second, credential)

        async def refused_there() -> bool:
            # Spend this second's budget on the first node, then ask the second.
            while "result" in await here.call("session/list", {}):
                pass
            reply = await there.call("session/list", {})
            return reply.get("error", {}).get("data") == {"limit": "rate_per_token"}

        await wait_for(refused_there, what="the second node to see the first node's requests")
        for conn in (here, there):
            await conn.close()
