"""A revoke fences what it takes away: work already accepted under the revoked authority is
decided again when it would commit (the ACP Remote security draft), over real connections
on two front nodes of one real Redis, agents as real subprocesses.

The principal that loses its rights is the ``observer`` token (read-write scopes, tenant
role observer): what more it may do comes only from the owner's per-session grant, which
the owner then revokes.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from broker.auth.roles import entry_id_for
from broker.auth.tokens import TokenStore
from broker.protocol.render import LET_GO_META, QUEUE_META
from broker.protocol.turns import PROMPT_ID_META, WITHDRAWN_META
from broker.serve import Broker
from broker.store.events import EventType
from broker.store.log import SessionLog

from .support.client import RawClient, text, wait_for
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
