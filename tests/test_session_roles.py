"""Session roles over real connections: tenant roles from tokens and JWT claims, owners'
per-session grants and revokes (``session_access/*``, REST ``/access``), and every operation
authorized against the caller's effective roles, on two front nodes of one real Redis.

Four principals of one tenant: the owner (a plain read-write token: it makes the session,
so it owns it), an observer, an approver and a controller (tokens made with those roles).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import jwt
import pytest
import websockets
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.auth.principal import Principal
from broker.auth.roles import (
    AclEntry,
    Permission,
    Role,
    effective,
    entry_id_for,
    grant_entry,
    owners_left,
    permissions_of,
)
from broker.auth.tokens import TokenStore
from broker.protocol.jsonrpc import INVALID_REQUEST
from broker.serve import Broker
from broker.store.client import connect

from .conftest import make_settings, run_cli
from .support.acp_http import HttpAcp, is_response
from .support.client import RawClient, text, tool_result_text

TENANT = "team"
CWD = "/work/roles"
JWT_SECRET = "a-test-secret-that-is-long-enough-for-hs256"


@dataclass
class Team:
    """Two front nodes and the tenant's tokens, by role."""

    nodes: list[Broker]
    tokens: dict[str, str]
    subjects: dict[str, str]
    redis_url: str


@pytest.fixture
async def team(redis_url: str) -> AsyncIterator[Team]:
    nodes = []
    for _ in range(2):
        node = Broker(
            make_settings(
                auth="on", jwt_secret=JWT_SECRET, rate_per_connection=1000, tenant=TENANT
            ),
            redis=connect(redis_url),
        )
        await node.start()
        nodes.append(node)
    store = TokenStore(nodes[0].redis)
    tokens, subjects = {}, {}
    for name, roles in (
        ("owner", None),
        ("observer", ["observer"]),
        ("approver", ["approver"]),
        ("controller", ["controller"]),
    ):
        token, info = await store.create(TENANT, ["read", "write"], name, roles)
        tokens[name], subjects[name] = token, f"token:{info.id}"
    yield Team(nodes, tokens, subjects, redis_url)
    for node in nodes:
        await node.stop()
        await node.redis.aclose()


def _url(node: Broker) -> str:
    return f"ws://127.0.0.1:{node.port}/acp"


async def _client(
    node: Broker, token: str, remote: bool = False, notices: bool = False
) -> RawClient:
    headers = {"Authorization": f"Bearer {token}"}
    client = await RawClient.connect(_url(node), additional_headers=headers)
    caps: dict[str, Any] = {"remote": {"core": {}}} if remote else {}
    if notices:  # a v1 client is sent the broker's notices when it says it takes them
        caps["session"] = {"notices": {}}
    reply = await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
    assert "result" in reply, reply
    return client


async def _session(team: Team) -> tuple[RawClient, str]:
    """The owner's client on node 0, and the session it made."""
    owner = await _client(team.nodes[0], team.tokens["owner"])
    return owner, await owner.new_session(CWD)


async def _loaded(
    node: Broker, token: str, session_id: str, remote: bool = False, notices: bool = False
) -> RawClient:
    client = await _client(node, token, remote, notices)
    reply = await client.call(
        "session/load", {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
    )
    assert "result" in reply, reply
    return client


def _forbidden(reply: dict[str, Any], permission: str) -> None:
    assert reply.get("error", {}).get("code") == INVALID_REQUEST, reply
    data = reply["error"]["data"]
    assert data == {"condition": "forbidden", "retryable": False, "requiredPermission": permission}


def _allowed(reply: dict[str, Any]) -> None:
    error = reply.get("error") or {}
    assert (error.get("data") or {}).get("condition") != "forbidden", reply


async def _prompt(client: RawClient, session_id: str, words: str = "hi") -> dict[str, Any]:
    return await client.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/notool " + words)}
    )


async def _grant(client: RawClient, session_id: str, subject: str, roles: list[str]) -> Any:
    params = {
        "sessionId": session_id,
        "subject": {"type": "principal", "principalId": subject},
        "roles": roles,
    }
    return await client.call("session_access/grant", params)


async def test_each_role_may_do_what_its_permissions_allow(team: Team) -> None:
    owner, sid = await _session(team)
    node = team.nodes[0]
    observer = await _loaded(node, team.tokens["observer"], sid, remote=True)
    approver = await _loaded(node, team.tokens["approver"], sid, remote=True)
    controller = await _loaded(node, team.tokens["controller"], sid, remote=True)
    title = {"sessionId": sid, "title": "t"}
    mode = {"sessionId": sid, "modeId": "default"}
    claim = {"sessionId": sid, "interactionId": "nope", "expectedRevision": "1"}
    # session.write: prompt, set_title, fork
    reply = await _prompt(observer, sid)
    _forbidden(reply, "session.write")
    assert "session.write" in reply["error"]["message"]
    _forbidden(await _prompt(approver, sid), "session.write")
    _forbidden(await observer.call("session/set_title", title), "session.write")
    fork = {"sessionId": sid, "cwd": CWD, "mcpServers": []}
    _forbidden(await observer.call("session/fork", fork), "session.write")
    assert "result" in await _prompt(controller, sid), "a controller prompts"
    assert "result" in await controller.call("session/set_title", title)
    # session.control: modes, config options, a cancel of the running turn
    _forbidden(await observer.call("session/set_mode", mode), "session.control")
    _forbidden(await approver.call("session/set_mode", mode), "session.control")
    _allowed(await controller.call("session/set_mode", mode))
    # session.approve: claims (a claim of nothing passes the check, then finds nothing)
    _forbidden(await controller.call("interaction/claim", claim), "session.approve")
    _forbidden(await observer.call("interaction/claim", claim), "session.approve")
    refused = await approver.call("interaction/claim", claim)
    assert refused["error"]["data"]["condition"] == "revision_conflict", refused
    # session.admin: the ACL, close, delete; only the owner
    for client in (observer, approver, controller):
        listing = await client.call("session_access/list", {"sessionId": sid})
        _forbidden(listing, "session.admin")
        _forbidden(await client.call("session/delete", {"sessionId": sid}), "session.admin")
    # A close is a detach: anyone who may read may let the session go from its connection.
    assert "result" in await observer.call("session/close", {"sessionId": sid})
    _allowed(await _prompt(controller, sid, "still here"))
    listed = await owner.call("session_access/list", {"sessionId": sid})
    assert listed["result"]["entries"] == [
        {
            "entryId": listed["result"]["entries"][0]["entryId"],
            "subject": {"type": "principal", "principalId": team.subjects["owner"]},
            "roles": ["owner"],
        }
    ]
    # session.read: every role loads and reads (done above); the session is unchanged by
    # what was refused: the controller's title stands, and it is still there
    assert "result" in await owner.call("session/set_title", title)
    assert "result" in await owner.call("session/delete", {"sessionId": sid})
    for client in (owner, observer, approver, controller):
        await client.close()


async def test_a_grant_takes_effect_and_a_revoke_refuses_at_once_on_another_front(
    team: Team,
) -> None:
    owner, sid = await _session(team)
    other = await _loaded(team.nodes[1], team.tokens["observer"], sid)
    _forbidden(await _prompt(other, sid), "session.write")
    granted = await _grant(owner, sid, team.subjects["observer"], ["controller"])
    entry = granted["result"]["entry"]
    assert entry["roles"] == ["controller"] and granted["result"]["aclRevision"] == "2"
    assert "result" in await _prompt(other, sid, "now I may"), "granted: it prompts"
    revoked = await owner.call(
        "session_access/revoke", {"sessionId": sid, "entryId": entry["entryId"]}
    )
    assert revoked["result"]["aclRevision"] == "3", revoked
    _forbidden(await _prompt(other, sid, "no more"), "session.write")
    # Every attachment hears of each change (a generic access-changed update), in the log.
    await other.read_until(
        lambda: any(
            "acpBroker/sessionAccess" in (u["update"].get("_meta") or {})
            and u["update"]["_meta"]["acpBroker/sessionAccess"]["change"] == "revoke"
            for u in other.updates(sid)
        )
    )
    await owner.close()
    await other.close()


async def test_the_last_owner_cannot_be_revoked_nor_demoted(team: Team) -> None:
    owner, sid = await _session(team)
    listed = await owner.call("session_access/list", {"sessionId": sid})
    entry_id = listed["result"]["entries"][0]["entryId"]
    refused = await owner.call("session_access/revoke", {"sessionId": sid, "entryId": entry_id})
    assert refused["error"]["data"]["condition"] == "last_owner", refused
    demoted = await _grant(owner, sid, team.subjects["owner"], ["observer"])
    assert demoted["error"]["data"]["condition"] == "last_owner", demoted
    unknown = await owner.call("session_access/revoke", {"sessionId": sid, "entryId": "x"})
    assert unknown["error"]["code"] == -32002, unknown
    bad = await _grant(owner, sid, team.subjects["observer"], ["boss"])
    assert bad["error"]["code"] == -32602 and "boss" in bad["error"]["message"], bad
    # With a second owner, the first may go; then it administers nothing more. (A grant sent
    # again under its operation id is answered as the first was, and applied once.)
    params = {
        "sessionId": sid,
        "subject": {"type": "principal", "principalId": team.subjects["controller"]},
        "roles": ["owner"],
        "_meta": {"operationId": "grant-1"},
    }
    first = await owner.call("session_access/grant", params)
    assert await owner.call("session_access/grant", params) == {**first, "id": first["id"] + 1}
    listed = await owner.call("session_access/list", {"sessionId": sid})
    assert listed["result"]["aclRevision"] == first["result"]["aclRevision"] == "2"
    gone = await owner.call("session_access/revoke", {"sessionId": sid, "entryId": entry_id})
    assert "result" in gone, gone
    again = await owner.call("session_access/list", {"sessionId": sid})
    _forbidden(again, "session.admin")
    await owner.close()


async def test_jwt_roles_claim(team: Team, caplog: pytest.LogCaptureFixture) -> None:
    owner, sid = await _session(team)
    base = {"tenant": TENANT, "exp": int(time.time()) + 600}
    watcher = jwt.encode({**base, "sub": "w", "roles": ["observer"]}, JWT_SECRET, "HS256")
    client = await _loaded(team.nodes[1], watcher, sid)
    _forbidden(await _prompt(client, sid), "session.write")
    assert "result" in await _grant(owner, sid, "jwt:w", ["controller"])
    assert "result" in await _prompt(client, sid), "granted by its subject: jwt:w"
    await client.close()
    bogus = jwt.encode({**base, "sub": "x", "roles": ["boss"]}, JWT_SECRET, "HS256")
    with (
        caplog.at_level(logging.INFO, logger="broker.auth.authenticator"),
        pytest.raises(websockets.InvalidStatus, match="401"),
    ):
        await _client(team.nodes[0], bogus)
    assert any("unknown role 'boss'" in r.getMessage() for r in caplog.records)
    await owner.close()


async def test_token_roles_are_checked_where_tokens_are_made(team: Team) -> None:
    with pytest.raises(ValueError, match="unknown role 'boss'"):
        await TokenStore(team.nodes[0].redis).create(TENANT, ["read"], "x", ["boss"])
    url = team.redis_url
    code, out, err = await run_cli("token", "create", "--redis-url", url, "--roles", "boss")
    assert code == 2 and "unknown role 'boss'" in err and not out.strip()
    code, out, err = await run_cli(
        "token", "create", "--redis-url", url, "--roles", "observer,approver"
    )
    assert code == 0 and "roles approver,observer" in err


async def test_rest_and_mcp_refuse_what_the_roles_do_not_allow(team: Team) -> None:
    owner, sid = await _session(team)
    node = team.nodes[1]
    base = f"http://127.0.0.1:{node.http_port}"
    watch = {"Authorization": f"Bearer {team.tokens['observer']}"}
    own = {"Authorization": f"Bearer {team.tokens['owner']}"}
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        refused = await http.post(f"/v1/sessions/{sid}/prompt", json={"text": "hi"}, headers=watch)
        assert refused.status_code == 403, refused.text
        assert "session.write" in refused.json()["detail"]
        assert (await http.delete(f"/v1/sessions/{sid}", headers=watch)).status_code == 403
        assert (await http.get(f"/v1/sessions/{sid}/access", headers=watch)).status_code == 403
        listed = await http.get(f"/v1/sessions/{sid}/access", headers=own)
        assert listed.status_code == 200 and len(listed.json()["entries"]) == 1
        body = {
            "subject": {"type": "principal", "principalId": team.subjects["observer"]},
            "roles": ["controller"],
        }
        granted = await http.post(f"/v1/sessions/{sid}/access", json=body, headers=own)
        assert granted.status_code == 200, granted.text
        entry_id = granted.json()["entry"]["entryId"]
        # A reader's event stream tells of the change, never whom it names.
        async with (
            asyncio.timeout(30),
            http.stream("GET", f"/v1/sessions/{sid}/events", headers=watch) as events,
        ):
            changes, lines = [], events.aiter_lines()
            async for line in lines:
                if line == "event: session_access":
                    changes.append(await anext(lines))
                    if entry_id in changes[-1]:
                        break
        assert not [c for c in changes if "token:" in c], changes
        allowed = await http.post(f"/v1/sessions/{sid}/prompt", json={"text": "hi"}, headers=watch)
        assert allowed.status_code in (200, 202), allowed.text
        gone = await http.delete(f"/v1/sessions/{sid}/access/{entry_id}", headers=own)
        assert gone.status_code == 200, gone.text
        refused = await http.post(f"/v1/sessions/{sid}/prompt", json={"text": "hi"}, headers=watch)
        assert refused.status_code == 403
        spec = (await http.get("/v1/openapi.json")).json()
        assert {"get", "post"} <= set(spec["paths"]["/v1/sessions/{id}/access"])
    async with (
        httpx.AsyncClient(headers=watch, timeout=30) as http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http)) as mcp,
    ):
        result = await mcp.call_tool("session_prompt", {"id": sid, "text": "hi"})
        assert result.is_error and tool_result_text(result).startswith("forbidden:"), result
        assert "session.write" in tool_result_text(result)
    await owner.close()


async def test_the_agents_question_goes_to_who_may_approve(team: Team) -> None:
    owner, sid = await _session(team)
    controller = await _loaded(team.nodes[0], team.tokens["controller"], sid)
    await controller.send_prompt(1, sid, "read it")  # the demo agent asks to read a file
    await owner.read_until(lambda: _asks(owner), 20)
    [ask] = _asks(owner)
    answer = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
    await owner.send({"jsonrpc": "2.0", "id": ask["id"], "result": answer})
    reply = await controller.reply_to(1, 20)
    assert reply["result"]["stopReason"] == "end_turn", reply
    assert not _asks(controller), "a controller is never asked what only approvers answer"
    await owner.close()
    await controller.close()


def _asks(client: RawClient) -> list[dict[str, Any]]:
    return [m for m in client.inbox if m.get("method") == "session/request_permission"]


async def test_v2_clients_are_held_to_the_same_roles(team: Team) -> None:
    owner, sid = await _session(team)
    clients = {}
    for name in ("observer", "owner"):
        headers = {"Authorization": f"Bearer {team.tokens[name]}"}
        client = await RawClient.connect(_url(team.nodes[1]), additional_headers=headers)
        reply = await client.call("initialize", {"protocolVersion": 2, "capabilities": {}})
        assert reply["result"]["protocolVersion"] == 2, reply
        clients[name] = client
    watcher = clients["observer"]
    _forbidden(await _prompt(watcher, sid), "session.write")
    config = {"sessionId": sid, "configId": "style", "value": "plain"}
    _forbidden(await watcher.call("session/set_config_option", config), "session.control")
    _forbidden(await watcher.call("session/delete", {"sessionId": sid}), "session.admin")
    listed = await clients["owner"].call("session_access/list", {"sessionId": sid})
    assert listed["result"]["aclRevision"] == "1", listed
    for client in (owner, *clients.values()):
        await client.close()


def test_effective_roles_are_the_live_entries_and_the_credentials_own() -> None:
    now = float(int(time.time()))  # whole seconds: an entry's expiresAt keeps microseconds
    reader = Principal("team", frozenset({"read", "write"}), "token:r", roles=frozenset())
    granted = grant_entry("token:r", ["controller"], expires_at=now + 60)
    lapsed = grant_entry("token:r", ["approver"], expires_at=now - 1)
    other = grant_entry("token:o", ["owner"])
    assert effective([granted, lapsed, other], reader, now) == {Role.CONTROLLER}
    assert effective([granted], reader, now + 61) == frozenset()
    plain = Principal("team", frozenset({"read", "write"}), "token:p")
    assert effective([], plain, now) == {Role.CONTROLLER, Role.APPROVER}
    viewer = Principal("team", frozenset({"read"}), "token:v")
    assert permissions_of(effective([other], viewer, now), viewer) == {
        Permission.READ,
        Permission.PRESENCE,
    }, "a read-only credential stays read-only, whatever it is granted"
    assert owners_left([other, granted], granted.entry_id, now)
    assert not owners_left([other], other.entry_id, now)
    assert entry_id_for("token:r") == granted.entry_id == lapsed.entry_id
    assert AclEntry.from_json(granted.to_json()) == granted
    for bad in ([], ["owner", "owner"], ["boss"]):
        with pytest.raises(ValueError):
            grant_entry("token:r", bad)


async def test_streamable_http_runs_the_same_checks_on_either_front(team: Team) -> None:
    owner, sid = await _session(team)
    bases = [f"http://127.0.0.1:{node.http_port}" for node in team.nodes]
    acp = HttpAcp(bases, team.tokens["observer"])  # its requests go to each front in turn
    try:
        await acp.initialize()
        stream = await acp.open(sid)  # the session's stream: its requests' responses
        for _ in range(2):
            msg_id = await acp.request(
                "session/prompt", {"sessionId": sid, "prompt": text("/notool x")}, sid
            )
            events = await stream.until(is_response(msg_id), timeout=30)
            _forbidden(events[-1][1], "session.write")
    finally:
        await acp.aclose()
        await owner.close()


async def test_an_observers_cancel_changes_nothing(team: Team) -> None:
    owner, sid = await _session(team)
    observer = await _loaded(team.nodes[1], team.tokens["observer"], sid)
    params = {"sessionId": sid, "prompt": text("/slow 2")}
    await owner.send({"jsonrpc": "2.0", "id": "run", "method": "session/prompt", "params": params})
    await owner.read_chunks(sid, 1, timeout=20)  # the turn runs
    # A v1 cancel is a notification: refused, it is dropped, and the turn runs on.
    await observer.send(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
    )
    reply = await owner.reply_to("run", 30)
    assert reply["result"]["stopReason"] == "end_turn", reply
    await owner.close()
    await observer.close()
