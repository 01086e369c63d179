"""A revoke fences what it takes away: work already accepted under the revoked authority is
decided again when it would commit (the ACP Remote security draft), over real connections
on two front nodes of one real Redis, agents as real subprocesses.

The principal that loses its rights is the ``observer`` token (read-write scopes, tenant
role observer): what more it may do comes only from the owner's per-session grant, which
the owner then revokes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx2 as httpx
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.auth.roles import entry_id_for
from broker.auth.tokens import TokenStore
from broker.protocol.render import LET_GO_META, QUEUE_META
from broker.protocol.turns import PROMPT_ID_META, WITHDRAWN_META
from broker.serve import Broker
from broker.store.events import EventType
from broker.store.log import SessionLog

from .support.client import RawClient, text, tool_result_text, wait_for
from .test_interactions import ALLOW, asks, logged
from .test_session_roles import CWD, TENANT, Team, _forbidden, _grant, _loaded, _session
from .test_session_roles import team as team  # the fixture: two fronts, the tenant's tokens

TURN_WAIT = 60.0
"""Seconds a turn (an agent subprocess's, on two busy cores) may take to end."""


def _named(session_id: str, words: str, activity: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": text(words), "_meta": {PROMPT_ID_META: activity}}


async def _send_prompt(client: RawClient, msg_id: str, params: dict[str, Any]) -> None:
    await client.send(
        {"jsonrpc": "2.0", "id": msg_id, "method": "session/prompt", "params": params}
    )


async def _revoke(owner: RawClient, session_id: str, subject: str) -> None:
    params = {"sessionId": session_id, "entryId": entry_id_for(subject)}
    reply = await owner.call("session_access/revoke", params)
    assert "result" in reply, reply


async def _events(team: Team, session_id: str, kind: str) -> list[dict[str, Any]]:
    events = await SessionLog(team.nodes[0].redis).read(TENANT, session_id)
    return [e.body for e in events if e.type == kind]


def _queue_changes(client: RawClient, session_id: str) -> list[tuple[str, str]]:
    return [
        (u["update"]["_meta"][QUEUE_META]["change"], u["update"]["_meta"][QUEUE_META]["activityId"])
        for u in client.updates(session_id)
        if QUEUE_META in (u["update"].get("_meta") or {})
    ]


async def _running_until_answered(owner: RawClient, session_id: str) -> None:
    """The owner's turn (``act-run``, request ``run``) runs until the owner answers the
    agent's question: the turn the others queue behind, ended when the test says."""
    await _send_prompt(owner, "run", _named(session_id, "read it", "act-run"))
    await owner.read_until(lambda: asks(owner), TURN_WAIT)


async def test_a_queued_prompt_whose_author_lost_write_is_withdrawn_not_run(team: Team) -> None:
    owner, sid = await _session(team)
    subject = team.subjects["observer"]
    assert "result" in await _grant(owner, sid, subject, ["controller"])
    author = await _loaded(team.nodes[1], team.tokens["observer"], sid)
    await _running_until_answered(owner, sid)
    await _send_prompt(author, "wait", _named(sid, "/notool queued", "act-wait"))
    await owner.read_until(lambda: ("queued", "act-wait") in _queue_changes(owner, sid), 30)
    await _revoke(owner, sid, subject)  # while it waits: its turn has not come
    await owner.send({"jsonrpc": "2.0", "id": asks(owner)[0]["id"], "result": ALLOW})
    withdrawn = await author.reply_to("wait", TURN_WAIT)
    assert withdrawn["result"] == {"stopReason": "cancelled", "_meta": {WITHDRAWN_META: True}}
    assert (await owner.reply_to("run", TURN_WAIT))["result"]["stopReason"] == "end_turn"
    # Every attachment sees it leave the queue; the log says why; it never ran.
    await owner.read_until(lambda: ("withdrawn", "act-wait") in _queue_changes(owner, sid), 30)
    [gone] = await _events(team, sid, EventType.PROMPT_WITHDRAWN)
    assert gone["promptId"] == "act-wait" and gone["reason"] == "revoked", gone
    ran = [e["promptId"] for e in await _events(team, sid, EventType.PROMPT)]
    assert ran == ["act-run"]
    await owner.close()
    await author.close()


async def test_a_queued_prompt_whose_author_keeps_write_runs(team: Team) -> None:
    owner, sid = await _session(team)
    controller = await _loaded(team.nodes[1], team.tokens["controller"], sid)
    await _running_until_answered(owner, sid)
    await _send_prompt(controller, "wait", _named(sid, "/notool queued", "act-wait"))
    await owner.read_until(lambda: ("queued", "act-wait") in _queue_changes(owner, sid), 30)
    await owner.send({"jsonrpc": "2.0", "id": asks(owner)[0]["id"], "result": ALLOW})
    # Its credential's own roles allow it: no ACL entry of its was ever needed.
    assert (await controller.reply_to("wait", TURN_WAIT))["result"]["stopReason"] == "end_turn"
    await owner.close()
    await controller.close()


async def test_a_revoke_that_takes_approve_reopens_the_claims_it_held(team: Team) -> None:
    owner, sid = await _session(team)
    subject = team.subjects["observer"]
    assert "result" in await _grant(owner, sid, subject, ["approver"])
    approver = await _loaded(team.nodes[1], team.tokens["observer"], sid, remote=True)
    await owner.send_prompt(1, sid, "read it")  # the demo agent asks to read a file
    await owner.read_until(lambda: asks(owner), 30)
    [pending] = (await approver.call("interaction/list", {"sessionId": sid}))["result"][
        "interactions"
    ]
    claim = {"sessionId": sid, "interactionId": pending["interactionId"]}
    taken = await approver.call("interaction/claim", {**claim, "expectedRevision": "1"})
    held = taken["result"]["interaction"]
    assert held["state"]["type"] == "claimed" and held["revision"] == "2", taken
    await _revoke(owner, sid, subject)
    # The claim is fenced: the interaction is open again, logged at the next revision.
    node = team.nodes[0]
    reopened = await wait_for(
        lambda: _last_state(node, sid, "3"), timeout=30, what="the claim reopened"
    )
    assert reopened["state"]["type"] == "open", reopened
    answer = {
        **claim,
        "claimId": held["state"]["claimId"],
        "fencingToken": held["state"]["fencingToken"],
        "response": ALLOW,
    }
    refused = await approver.call("interaction/respond", answer)
    assert refused["error"]["data"]["condition"] == "forbidden", refused
    # Granted approve again, its old claim is still not current: the answer is refused.
    assert "result" in await _grant(owner, sid, subject, ["approver"])
    stale = await approver.call("interaction/respond", answer)
    assert stale["error"]["data"]["condition"] == "revision_conflict", stale
    await owner.send({"jsonrpc": "2.0", "id": asks(owner)[0]["id"], "result": ALLOW})
    assert (await owner.reply_to(1, TURN_WAIT))["result"]["stopReason"] == "end_turn"
    await owner.close()
    await approver.close()


async def _last_state(node: Broker, session_id: str, revision: str) -> dict[str, Any] | None:
    """The interaction's last logged record, once it is at ``revision``."""
    records = await logged(node, session_id)
    return records[-1] if records and records[-1]["revision"] == revision else None


def _let_go(client: RawClient, session_id: str) -> list[dict[str, Any]]:
    return [
        u["update"]
        for u in client.updates(session_id)
        if (u["update"].get("_meta") or {}).get(LET_GO_META)
    ]


async def test_a_revoke_that_takes_read_stops_delivery_on_every_front(team: Team) -> None:
    owner, sid = await _session(team)
    # A guest's credential holds no role of its own: what it may do, its entry alone gives.
    guest, info = await TokenStore(team.nodes[0].redis).create(TENANT, ["read", "write"], "g", [])
    subject = f"token:{info.id}"
    assert "result" in await _grant(owner, sid, subject, ["observer"])
    guests = [await _loaded(node, guest, sid, notices=True) for node in team.nodes]
    watcher = await _loaded(team.nodes[1], team.tokens["observer"], sid)
    await _revoke(owner, sid, subject)
    for client in guests:
        await client.read_until(partial(_let_go, client, sid), 30)
        [notice] = _let_go(client, sid)
        assert notice["sessionUpdate"] == "notice" and "revoked" in notice["description"], notice
    seen = [len(client.updates(sid)) for client in guests]
    # The session goes on for the others; none of it reaches the guest's connections.
    assert (await owner.call("session/prompt", {"sessionId": sid, "prompt": text("/notool on")}))[
        "result"
    ]["stopReason"] == "end_turn"
    await watcher.read_until(lambda: watcher.chunks(sid), 30)
    assert [len(client.updates(sid)) for client in guests] == seen
    for client in guests:
        load = {"sessionId": sid, "cwd": CWD, "mcpServers": []}
        _forbidden(await client.call("session/load", load), "session.read")
        await client.close()
    await owner.close()
    await watcher.close()


async def _guest(team: Team) -> tuple[str, str]:
    """A token whose credential holds no role of its own (what it may do on a session, its
    entry there alone gives), and its subject."""
    token, info = await TokenStore(team.nodes[0].redis).create(TENANT, ["read", "write"], "g", [])
    return token, f"token:{info.id}"


async def _session_with_guest(team: Team, roles: list[str]) -> tuple[RawClient, str, str, str]:
    """The owner, a new session of theirs, and a guest (:func:`_guest`: its token and
    subject) granted ``roles`` on it."""
    owner, sid = await _session(team)
    guest, subject = await _guest(team)
    assert "result" in await _grant(owner, sid, subject, roles)
    return owner, sid, guest, subject


def _base(node: Broker) -> str:
    return f"http://127.0.0.1:{node.http_port}"


async def _frames(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """An SSE stream's event frames, each ``{"id", "event", "data"}`` (data parsed)."""
    fields: dict[str, str] = {}
    async for line in lines:
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if "data" in fields:
            yield {"id": int(fields["id"]), "event": fields["event"], **json.loads(fields["data"])}
        fields = {}


def _is_revoke_of(frame: dict[str, Any], subject: str) -> bool:
    body = frame["event"]
    return body.get("change") == "revoke" and body.get("entryId") == entry_id_for(subject)


def _is_grant_of(frame: dict[str, Any], subject: str) -> bool:
    body = frame["event"]
    return body.get("change") == "grant" and body.get("entryId") == entry_id_for(subject)


async def test_a_revoke_that_takes_read_ends_the_readers_event_stream(team: Team) -> None:
    owner, sid, guest, subject = await _session_with_guest(team, ["observer"])
    path = f"/v1/sessions/{sid}/events"
    headers = {"Authorization": f"Bearer {guest}"}
    on = {"sessionId": sid, "prompt": text("/notool on")}
    async with httpx.AsyncClient(
        base_url=_base(team.nodes[1]), headers=headers, timeout=30
    ) as http:
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(60), http.stream("GET", path) as stream:
            assert stream.status_code == 200
            async for frame in _frames(stream.aiter_lines()):
                seen.append(frame)
                if _is_grant_of(frame, subject):  # the stream is live: revoke, then go on
                    await _revoke(owner, sid, subject)
                    assert (await owner.call("session/prompt", on))["result"]["stopReason"]
        # It ended by itself, the revoke its last event, though the session went on.
        last = seen[-1]
        assert _is_revoke_of(last, subject), last
        later = await SessionLog(team.nodes[0].redis).read(TENANT, sid)
        assert later[-1].seq > last["id"], "the owner's turn came after the revoke"
        reconnect = await http.get(path, headers={"Last-Event-ID": str(last["id"])})
        assert reconnect.status_code == 403, reconnect.text
        # Granted again, its stream from the start passes the revoke in the history by.
        assert "result" in await _grant(owner, sid, subject, ["observer"])
        again = {"sessionId": sid, "prompt": text("/notool again")}
        replayed: list[dict[str, Any]] = []
        regranted = None
        async with asyncio.timeout(60), http.stream("GET", path) as stream:
            async for frame in _frames(stream.aiter_lines()):
                replayed.append(frame)
                if frame["id"] > last["id"] and _is_grant_of(frame, subject):
                    regranted = frame["id"]
                    assert (await owner.call("session/prompt", again))["result"]["stopReason"]
                if regranted is not None and frame["event"]["type"] == EventType.PROMPT_END:
                    break  # the turn after the new grant reached it live: it did not end
        assert any(_is_revoke_of(frame, subject) for frame in replayed)
        assert regranted is not None and replayed[-1]["id"] > regranted
    await owner.close()


async def test_a_revoke_that_takes_read_answers_a_tool_driven_turn_forbidden(
    team: Team,
) -> None:
    owner, sid, guest, subject = await _session_with_guest(team, ["controller"])
    await _running_until_answered(owner, sid)  # the guest's turn queues behind the question
    node = team.nodes[1]
    wait = 120.0
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {guest}"}, timeout=wait) as http,
        Client(streamable_http_client(f"{_base(node)}/mcp", http_client=http)) as mcp,
    ):
        prompt = {"id": sid, "text": "/notool queued", "wait": wait}
        call = asyncio.ensure_future(mcp.call_tool("session_prompt", prompt))
        await owner.read_until(lambda: [c for c, _ in _queue_changes(owner, sid)], 30)
        await _revoke(owner, sid, subject)
        async with asyncio.timeout(30):  # at the revoke, not at the end of its wait
            result = await call
    answer = tool_result_text(result)
    assert result.is_error and answer.startswith("forbidden:"), answer
    assert "revoke" in answer and "session.read" in answer, answer
    # The owner's turn goes on and ends; the guest's never ran.
    await owner.send({"jsonrpc": "2.0", "id": asks(owner)[0]["id"], "result": ALLOW})
    assert (await owner.reply_to("run", TURN_WAIT))["result"]["stopReason"] == "end_turn"
    ran = [e["promptId"] for e in await _events(team, sid, EventType.PROMPT)]
    assert ran == ["act-run"]
    await owner.close()


async def test_a_revoke_mid_turn_answers_its_rest_prompt_without_the_turns_output(
    team: Team,
) -> None:
    owner, sid, guest, subject = await _session_with_guest(team, ["controller"])
    headers = {"Authorization": f"Bearer {guest}"}
    async with httpx.AsyncClient(
        base_url=_base(team.nodes[1]), headers=headers, timeout=30
    ) as http:
        body = {"text": "/slow 600", "wait": 120}  # 2 minutes of chunks, unless stopped
        call = asyncio.ensure_future(
            http.post(f"/v1/sessions/{sid}/prompt", json=body, timeout=150)
        )
        await owner.read_until(lambda: owner.chunks(sid), 30)  # the turn is producing
        await _revoke(owner, sid, subject)
        async with asyncio.timeout(30):
            refused = await call
    assert refused.status_code == 403, refused.text
    assert "revoke" in refused.json()["detail"]
    assert "chunk" not in refused.text
    await owner.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
    await wait_for(lambda: _events(team, sid, EventType.PROMPT_END), TURN_WAIT, "the turn ended")
    await owner.close()
