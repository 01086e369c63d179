"""The ACP Remote draft's shared-session conformance cases (``rfds-remote-conformance``:
the required shared-session matrix and the pending-interaction cases), each with a fault in
the middle: a front node killed -9 (its clients reconnect to the other), the agent host
holding the session killed -9 (another takes the session over) or Redis restarted with its
data (append-only file).

Every run: two front nodes as processes, agent hosts as processes, a real redis-server, the
demo agent (it asks ``session/request_permission`` for "read it"), auth on (API tokens, one
read-only: the observer) and four WebSocket connections: ``asker`` (ACP v1, plain: it is
asked directly), ``claimer`` (v1, negotiated the draft), ``peer`` (v2, negotiated the draft)
and ``observer`` (v1, draft, read-only token). The asker and the peer are on the front that
may be killed.

Cases tested here, by the draft's names (the test and step that checks each):

* ordering: :func:`_check_one_order` (every attachment's interaction records and queue
  changes are the log's, in the log's order, after the fault too);
* stale revision, claim fencing (released, another's, expired claim), concurrent
  compare-and-set, claim expiry reopens, unauthorized observer:
  :func:`_claims_after_the_fault`;
* scoped cancel (by activity id; a late cancel is a recorded no-op) and queue convergence:
  :func:`_queue_before_the_fault`, :func:`_cancel_after_the_fault`;
* discovery after reconnect (``interaction/list``): :func:`_discover`;
* retry with the same operation id across the fault (a prompt, an answer):
  :func:`_retry_prompt`, :func:`_answer`;
* terminal states (one terminal record per interaction, nothing pending after) and no
  stranding (the host's loss cancels its questions, visibly, and the session goes on):
  :func:`_check_terminal`, :func:`_after_host_loss`.

A second run per fault (:func:`test_roles_attachments_and_presence_through_a_fault`: two
fronts, a short ``presence_ttl``) tests the rest, with five connections: ``owner`` (v1
plain, made the session), ``follower`` (v2, attached with ``presence``), ``guest`` (v1,
draft, a read-write token naming the ``observer`` role) and ``drafter`` (v2) on the front
that may be killed, and the guest's second connection after the fault:

* roles (an owner's grants across the fault; an observer refused, a controller accepted,
  a revoke honoured on the other front; the roles an attachment shows):
  :func:`_roles_before_the_fault`, :func:`_roles_after_the_fault`, :func:`_detach_mid_way`;
* detach (idempotent, the session runs on; a re-attach after the fault is a new attachment
  replaying from its cursor, without loss or duplicates): :func:`_detach_mid_way`,
  :func:`_reattach`;
* presence (the snapshot is exactly the windows attached, a killed front's lapsing within
  ``presence_ttl``; the deltas reach a follower; nothing private): :func:`_presence_is`,
  :func:`_nothing_private`;
* private state, as the broker has it: an attachment is its connection's (another, even of
  the same principal, can neither detach it nor cross its barrier): :func:`_private_state`;
  a claim is its holder's (another's answer with it is refused): :func:`_claims_after_the_fault`;
  the access changes every attachment hears name nobody: :func:`_roles_after_the_fault`.

Not applicable (the broker has none of it): controller lease transfer fencing (the policy
is ``ordered_multi_writer``: no controller lease), private drafts and per-user read state,
session termination as a draft operation (``session/close`` is a detach here;
``session/delete`` is the owner's: ``tests/test_session_roles.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from broker.auth.tokens import TokenStore
from broker.protocol.presence import ENTRY_FIELDS
from broker.protocol.render import POSITION_META, QUEUE_META
from broker.protocol.turns import PROMPT_ID_META
from broker.store.client import commands, connect
from broker.store.events import EventType
from broker.store.keys import lease_key
from broker.store.log import SessionLog

from .support.client import RawClient, text, wait_for
from .support.redis_server import RestartableRedis, restartable_redis
from .test_attach import attach_params, ready_params, window_texts
from .test_interactions import ALLOW, asks, interaction_updates
from .test_presence import deltas, names
from .test_scale_out import Deployment, _kill_holder, cluster_of
from .test_session_roles import _forbidden, _grant

pytestmark = pytest.mark.slow

TENANT = "team"
CWD = "/srv/conformance"
FAULTS = ("front", "host", "redis")
WAIT = 60.0
"""Seconds any one step may take: generous, as the suite runs these beside other tests on
two busy cores, and a host's takeover waits out the lost host's lease first."""
REMOTE: dict[str, Any] = {"remote": {"core": {}}}


@dataclass
class Matrix:
    """The deployment, its store, its credentials (read-write, read-only, and the guest's:
    read-write, naming the ``observer`` role), the session."""

    redis: RestartableRedis
    deployment: Deployment
    writer: str
    reader: str
    guest: str
    guest_subject: str
    session_id: str = ""

    async def events(self) -> list[Any]:
        store = connect(self.redis.url)
        try:
            return await SessionLog(store).read(TENANT, self.session_id)
        finally:
            await store.aclose()

    async def interactions(self) -> list[dict[str, Any]]:
        return [e.body["interaction"] for e in await self.events() if e.type == "interaction"]

    async def join(
        self,
        front: int,
        *,
        version: int = 1,
        remote: bool = True,
        token: str | None = None,
        name: str = "conformance",
        resume: bool = True,
    ) -> RawClient:
        """A connection on front ``front``, shown in presence as ``name``, with the session
        resumed on it (the whole log replayed, for v1 a load) unless ``resume`` is false."""
        url = self.deployment.nodes[front].url
        headers = {"Authorization": f"Bearer {token or self.writer}"}
        client = await RawClient.connect(url, additional_headers=headers)
        caps = REMOTE if remote else {}
        field, info = (
            ("clientCapabilities", "clientInfo") if version == 1 else ("capabilities", "info")
        )
        init: dict[str, Any] = {"protocolVersion": version, field: caps}
        init[info] = {"name": name, "version": "1"}
        assert "result" in await client.call("initialize", init)
        if self.session_id and resume:
            params: dict[str, Any] = {"sessionId": self.session_id, "cwd": CWD, "mcpServers": []}
            if version == 1:
                reply = await client.call("session/load", params, WAIT)
            else:
                reply = await client.call(
                    "session/resume", {**params, "replayFrom": {"type": "start"}}, WAIT
                )
            assert "result" in reply, reply
        return client


@contextlib.asynccontextmanager
async def matrix(
    tmp_path: Path, hosts: int, front_env: dict[str, str] | None = None
) -> AsyncIterator[Matrix]:
    with restartable_redis(aof=True) as redis:
        store = connect(redis.url)
        tokens = TokenStore(store)
        writer, _ = await tokens.create(TENANT, ["read", "write"])
        reader, _ = await tokens.create(TENANT, ["read"])
        guest, info = await tokens.create(TENANT, ["read", "write"], "guest", ["observer"])
        await store.aclose()
        env = {"ACP_BROKER_AUTH": "on", **(front_env or {})}
        async with cluster_of(
            redis.url, tmp_path, fronts=2, hosts=hosts, front_env=env
        ) as deployment:
            yield Matrix(redis, deployment, writer, reader, guest, f"token:{info.id}")


# -- helpers ----------------------------------------------------------------------------------


def _records(client: RawClient) -> list[tuple[str, str, str]]:
    """The interaction records a client was told of: (id, revision, state)."""
    return [
        (u["interactionId"], u["revision"], u["state"]["type"]) for u in interaction_updates(client)
    ]


def _queue_changes(client: RawClient, session_id: str) -> list[tuple[str, str]]:
    return [
        (u["update"]["_meta"][QUEUE_META]["change"], u["update"]["_meta"][QUEUE_META]["activityId"])
        for u in client.updates(session_id)
        if QUEUE_META in (u["update"].get("_meta") or {})
    ]


def _prompt(session_id: str, words: str, activity: str, op: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {PROMPT_ID_META: activity}
    if op is not None:
        meta["operationId"] = op
    return {"sessionId": session_id, "prompt": text(words), "_meta": meta}


async def _send(client: RawClient, msg_id: str, method: str, params: dict[str, Any]) -> None:
    await client.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})


async def _seen_by(
    clients: list[RawClient], condition: Callable[[RawClient], Any], what: str
) -> None:
    """Each client reads until ``condition(client)`` holds (bounded)."""
    for n, client in enumerate(clients):
        try:
            await client.read_until(functools.partial(condition, client), WAIT)
        except (AssertionError, TimeoutError):
            raise AssertionError(f"{what}: not seen by #{n}; saw {_records(client)}") from None


def _response(base: dict[str, Any], claim: dict[str, Any], revision: int) -> dict[str, Any]:
    """``interaction/respond`` params: allow, by the claim in ``claim`` (a claimed state)."""
    return {
        **base,
        "claimId": claim["claimId"],
        "fencingToken": claim["fencingToken"],
        "expectedRevision": str(revision),
        "response": ALLOW,
    }


def _condition(reply: dict[str, Any]) -> str:
    return str(((reply.get("error") or {}).get("data") or {}).get("condition"))


# -- the cases --------------------------------------------------------------------------------


async def _queue_before_the_fault(m: Matrix, claimer: RawClient, all_: list[RawClient]) -> None:
    """Queue convergence: a prompt sent while the asker's turn waits is queued, and every
    attachment sees it queued (the same change, the same activity)."""
    params = _prompt(m.session_id, "/notool queued", "act-queued", op="op-queued")
    await _send(claimer, "queued", "session/prompt", params)
    await _seen_by(
        all_,
        lambda c: ("queued", "act-queued") in _queue_changes(c, m.session_id),
        "the queued prompt",
    )


async def _discover(m: Matrix, client: RawClient) -> dict[str, Any]:
    """Discovery after reconnect: ``interaction/list`` names the pending question."""
    listed = await client.call("interaction/list", {"sessionId": m.session_id})
    [pending] = listed["result"]["interactions"]
    return dict(pending)


async def _claims_after_the_fault(
    m: Matrix, pending: dict[str, Any], claimer: RawClient, peer: RawClient, observer: RawClient
) -> dict[str, Any]:
    """Stale revision, claim fencing, concurrent compare-and-set, claim expiry and the
    observer's refusal, on the question pending after the fault. Returns it, open."""
    iid, revision = pending["interactionId"], int(pending["revision"])
    base = {"sessionId": m.session_id, "interactionId": iid}
    # An observer (read-only token) can neither claim nor answer.
    refused = await observer.call("interaction/claim", {**base, "expectedRevision": str(revision)})
    assert _condition(refused) == "forbidden", refused
    fake = {"claimId": "claim_0", "fencingToken": "1", "response": ALLOW}
    refused = await observer.call(
        "interaction/respond", {**base, **fake, "expectedRevision": str(revision)}
    )
    assert _condition(refused) == "forbidden", refused
    before = len(await m.interactions())
    # A stale revision is refused with the current one, and changes nothing.
    stale = await peer.call("interaction/claim", {**base, "expectedRevision": str(revision - 1)})
    assert _condition(stale) == "revision_conflict", stale
    assert stale["error"]["data"]["currentInteractionRevision"] == str(revision)
    assert len(await m.interactions()) == before
    # The claimer claims; another's attempt with its claim id answers nothing; released,
    # the claim answers nothing either.
    taken = await claimer.call("interaction/claim", {**base, "expectedRevision": str(revision)})
    state = taken["result"]["interaction"]["state"]
    answer = _response(base, state, revision + 1)
    assert _condition(await peer.call("interaction/respond", answer)) == "revision_conflict"
    release = {k: v for k, v in answer.items() if k != "response"}
    released = await claimer.call("interaction/release", release)
    assert released["result"]["interaction"]["state"]["type"] == "open", released
    fenced = {**answer, "expectedRevision": str(revision + 2)}
    assert _condition(await claimer.call("interaction/respond", fenced)) == "revision_conflict"
    # Concurrent compare-and-set: of two claims at one revision exactly one wins.
    now = revision + 2
    short = {**base, "expectedRevision": str(now), "requestedTtlSeconds": "1"}
    replies = await asyncio.gather(
        claimer.call("interaction/claim", short), peer.call("interaction/claim", short)
    )
    won = [r for r in replies if "result" in r]
    lost = [r for r in replies if "error" in r]
    assert len(won) == 1 and len(lost) == 1, replies
    assert _condition(lost[0]) == "revision_conflict"
    winner = claimer if "result" in replies[0] else peer
    held = won[0]["result"]["interaction"]["state"]
    # The claim expires: the interaction reopens, and every follower sees so.
    reopened = (iid, str(now + 2), "open")
    await _seen_by([claimer, peer, observer], lambda c: reopened in _records(c), "the reopening")
    expired = _response(base, held, now + 2)
    assert _condition(await winner.call("interaction/respond", expired)) == "revision_conflict"
    return {**pending, "revision": str(now + 2)}


async def _answer(m: Matrix, pending: dict[str, Any], peer: RawClient) -> None:
    """The peer claims and answers with an operation id; the retry with the same id is
    answered with the first outcome and applies nothing twice."""
    base = {"sessionId": m.session_id, "interactionId": pending["interactionId"]}
    taken = await peer.call(
        "interaction/claim",
        {**base, "expectedRevision": pending["revision"], "operationId": "op-claim"},
    )
    claimed = taken["result"]["interaction"]
    answer = {
        **_response(base, claimed["state"], int(claimed["revision"])),
        "operationId": "op-answer",
    }
    first = await peer.call("interaction/respond", answer)
    assert first["result"]["interaction"]["state"]["type"] == "resolved", first
    again = await peer.call("interaction/respond", answer)
    assert again == {**first, "id": again["id"]}
    resolved = [i for i in await m.interactions() if i["state"]["type"] == "resolved"]
    assert [i["interactionId"] for i in resolved] == [pending["interactionId"]]


async def _cancel_after_the_fault(m: Matrix, claimer: RawClient, all_: list[RawClient]) -> None:
    """Scoped cancel: a queued prompt withdrawn by its activity id (its author's cancel),
    seen by every attachment; the same cancel again is a recorded no-op."""
    await _send(claimer, "withdrawn", "session/prompt", _prompt(m.session_id, "/notool w", "act-w"))
    await _seen_by(
        all_, lambda c: ("queued", "act-w") in _queue_changes(c, m.session_id), "act-w queued"
    )
    cancel = {"sessionId": m.session_id, "activityId": "act-w"}
    await claimer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": cancel})
    assert (await claimer.reply_to("withdrawn", WAIT))["result"]["stopReason"] == "cancelled"
    await _seen_by(
        all_, lambda c: ("withdrawn", "act-w") in _queue_changes(c, m.session_id), "withdrawn"
    )
    await claimer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": cancel})

    async def ignored() -> bool:
        return any(e.type == EventType.CANCEL_IGNORED for e in await m.events())

    await wait_for(ignored, WAIT, "the late cancel recorded")


async def _retry_prompt(m: Matrix, front: int) -> None:
    """The queued prompt sent again with its operation id, on a new connection to the front
    that lives, after the fault: answered with its turn's end; it ran once."""
    retry = await m.join(front)
    params = _prompt(m.session_id, "/notool queued", "act-queued", op="op-queued")
    reply = await retry.call("session/prompt", params, WAIT)
    assert reply["result"]["stopReason"] == "end_turn", reply
    ran = [e.body["promptId"] for e in await m.events() if e.type == EventType.PROMPT]
    assert ran.count("act-queued") == 1, ran
    await retry.close()


async def _check_terminal(m: Matrix, followers: list[RawClient]) -> None:
    """Terminal states: each interaction ends exactly once, and none is pending after."""
    records = await m.interactions()
    ends: dict[str, int] = {}
    for record in records:
        if record["state"]["type"] in ("resolved", "cancelled", "expired"):
            ends[record["interactionId"]] = ends.get(record["interactionId"], 0) + 1
    assert set(ends) == {r["interactionId"] for r in records}
    assert set(ends.values()) == {1}, ends
    for client in followers:
        listed = await client.call("interaction/list", {"sessionId": m.session_id})
        assert listed["result"]["interactions"] == []


async def _check_one_order(m: Matrix, followers: list[RawClient]) -> None:
    """One session-wide order: every follower was told of the log's interaction records
    and queue changes, each once, in the log's order."""
    events = await m.events()
    logged = [
        (e.body["interaction"]["interactionId"], e.body["interaction"]["revision"],
         e.body["interaction"]["state"]["type"])
        for e in events if e.type == "interaction"
    ]  # fmt: skip
    queue_kinds = {EventType.PROMPT_QUEUED, EventType.PROMPT_WITHDRAWN, EventType.CANCEL_IGNORED}
    queued = [
        e.body.get("promptId") or e.body.get("activityId") for e in events if e.type in queue_kinds
    ]
    await _seen_by(followers, lambda c: len(_records(c)) >= len(logged), "every record")
    for client in followers:
        assert _records(client) == logged
        assert [a for _, a in _queue_changes(client, m.session_id)] == queued


async def _after_host_loss(
    m: Matrix, asker: RawClient, followers: list[RawClient], lost: dict[str, Any]
) -> dict[str, Any]:
    """No stranding: the question the lost host left is cancelled (host lost), every
    follower sees it end, the asker's turn fails, and the session goes on: a new prompt
    asks a new question, pending for the cases after."""
    ended = (lost["interactionId"], str(int(lost["revision"]) + 1), "cancelled")
    await _seen_by(followers, lambda c: ended in _records(c), "the lost question cancelled")
    [last] = [u for u in interaction_updates(followers[0]) if u["state"]["type"] == "cancelled"]
    assert last["state"]["_meta"] == {"acpBroker/reason": "host_lost"}
    assert "cancelledAt" in last["state"]
    late = {"sessionId": m.session_id, "interactionId": lost["interactionId"]}
    late["expectedRevision"] = ended[1]
    assert _condition(await followers[0].call("interaction/claim", late)) == "revision_conflict"
    assert (await asker.reply_to("ask", WAIT))["error"]["code"] == -32603
    await _send(asker, "ask-again", "session/prompt", _prompt(m.session_id, "read it", "act-ask2"))
    await asker.read_until(lambda: len(asks(asker)) >= 2, WAIT)
    return await _discover(m, followers[0])


# -- the faults -------------------------------------------------------------------------------


async def _fault(m: Matrix, fault: str) -> None:
    if fault == "front":
        await m.deployment.nodes[0].kill()
    elif fault == "host":
        store = connect(m.redis.url)
        holder = await commands(store).get(lease_key(TENANT, m.session_id))
        await store.aclose()
        await _kill_holder(m.deployment.hosts, holder)
    else:
        m.redis.kill()
        m.redis.start()


@pytest.mark.parametrize("fault", FAULTS)
async def test_shared_session_conformance_through_a_fault(tmp_path: Path, fault: str) -> None:
    async with matrix(tmp_path, hosts=2 if fault == "host" else 1) as m:
        asker = await m.join(0, remote=False)
        created = await asker.call("session/new", {"cwd": CWD, "mcpServers": []}, WAIT)
        m.session_id = created["result"]["sessionId"]
        claimer = await m.join(1)
        peer = await m.join(0, version=2)
        observer = await m.join(1, token=m.reader)
        await _send(asker, "ask", "session/prompt", _prompt(m.session_id, "read it", "act-ask"))
        await asker.read_until(lambda: asks(asker), WAIT)
        followers = [claimer, peer, observer]
        await _seen_by(followers, lambda c: _records(c), "the question")
        await _queue_before_the_fault(m, claimer, [asker, *followers])
        pending = await _discover(m, claimer)

        await _fault(m, fault)

        if fault == "front":  # the asker and the peer reconnect to the other front
            asker, peer = await m.join(1, remote=False), await m.join(1, version=2)
            followers = [claimer, peer, observer]
        if fault == "host":
            pending = await _after_host_loss(m, asker, followers, pending)
        else:
            assert await _discover(m, peer) == pending  # discovery after reconnect
        pending = await _claims_after_the_fault(m, pending, claimer, peer, observer)
        await _cancel_after_the_fault(m, claimer, [asker, *followers])
        await _answer(m, pending, peer)
        await _retry_prompt(m, 1)
        await _check_terminal(m, followers)
        await _check_one_order(m, followers)
        for client in (asker, claimer, peer, observer):
            await client.close()


# -- roles, attachments, presence, private state ----------------------------------------------

PRESENCE_TTL = 3.0
"""The fronts' ``presence_ttl`` in the attachment runs: a killed front's windows leave
presence within it (their sweeps run every second)."""


async def _attach(
    m: Matrix, client: RawClient, subscriptions: list[str], after: int | None = None
) -> dict[str, Any]:
    """``session/attach`` (the whole log replayed, or what follows seq ``after``), then
    ``session/ready``; returns the attach's result."""
    replay: dict[str, Any] = {"type": "start"}
    if after is not None:
        epoch = (await _snapshot(m)).epoch
        replay = {"type": "after_event", "sourceEventId": f"event_{epoch}_{after}"}
    params = attach_params(m.session_id, subscriptions=subscriptions, replayFrom=replay)
    reply = await client.call("session/attach", params, WAIT)
    attached = reply["result"]
    assert attached["recovery"]["type"] == "event_replay", attached
    ready = await client.call("session/ready", ready_params(m.session_id, attached), WAIT)
    assert ready["result"] == {}, ready
    return dict(attached)


async def _snapshot(m: Matrix) -> Any:
    store = connect(m.redis.url)
    try:
        return await SessionLog(store).snapshot(TENANT, m.session_id)
    finally:
        await store.aclose()


TURNS = {"/notool one": "act-one", "/notool two": "act-two", "/notool guest": "act-guest"}
"""The prompts that run in the attachment runs, by their activity ids."""


async def _turn(client: RawClient, m: Matrix, words: str) -> None:
    """A prompt of ``client``'s (one of ``TURNS``) that runs to its end."""
    reply = await client.call("session/prompt", _prompt(m.session_id, words, TURNS[words]), WAIT)
    assert reply["result"]["stopReason"] == "end_turn", reply


def _seqs(client: RawClient, session_id: str) -> list[int]:
    """The log positions of the session's updates a client was sent, in order."""
    return [
        int(u["_meta"][POSITION_META]["seq"])
        for u in client.updates(session_id)
        if POSITION_META in (u.get("_meta") or {})
    ]


def _presence(client: RawClient, session_id: str) -> list[tuple[str, str]]:
    """The presence changes a follower was sent: (change, display name)."""
    return [
        (d["change"], d.get("participant", {}).get("displayName", ""))
        for d in deltas(client, session_id)
    ]


async def _present(m: Matrix, front: int) -> dict[str, Any]:
    """``GET /v1/sessions/{id}/presence`` on front ``front``."""
    base = f"http://127.0.0.1:{m.deployment.nodes[front].http_port}"
    headers = {"Authorization": f"Bearer {m.writer}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=WAIT) as http:
        answer = await http.get(f"/v1/sessions/{m.session_id}/presence")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def _presence_is(m: Matrix, front: int, expected: list[str]) -> dict[str, Any]:
    """Waits (bounded: a killed front's windows lapse after ``PRESENCE_TTL``) until the
    snapshot shows exactly ``expected`` (display names); returns it."""
    found: dict[str, Any] = {}

    async def exact() -> bool:
        found.update(await _present(m, front))
        return names(found) == sorted(expected)

    try:
        await wait_for(exact, PRESENCE_TTL + WAIT, f"presence {expected}")
    except (AssertionError, TimeoutError):
        raise AssertionError(f"presence: {names(found)}, not {sorted(expected)}") from None
    return found


def _nothing_private(m: Matrix, shown: Any) -> None:
    """Presence shows the entries' public fields only: no token, subject or address."""
    for participant in shown["participants"]:
        assert set(participant) <= set(ENTRY_FIELDS), participant
    dumped = json.dumps(shown)
    for private in (m.writer, m.reader, m.guest, "token:", "127.0.0.1"):
        assert private not in dumped, private


async def _roles_before_the_fault(m: Matrix, owner: RawClient, guest: RawClient) -> None:
    """Roles: the owner grants the guest ``observer`` explicitly; its prompt is refused."""
    granted = await _grant(owner, m.session_id, m.guest_subject, ["observer"])
    assert granted["result"]["entry"]["roles"] == ["observer"], granted
    _forbidden(
        await guest.call("session/prompt", _prompt(m.session_id, "/notool no", "g0")),
        "session.write",
    )


async def _roles_after_the_fault(
    m: Matrix, owner: RawClient, guest: RawClient, elsewhere: RawClient
) -> None:
    """Roles: still an observer after the fault; granted ``controller``, its prompt runs;
    revoked by the owner, its prompt is refused on ``elsewhere`` (the other front, when
    both live)."""
    refused = await guest.call("session/prompt", _prompt(m.session_id, "/notool no", "g1"), WAIT)
    _forbidden(refused, "session.write")
    granted = await _grant(owner, m.session_id, m.guest_subject, ["controller"])
    await _turn(guest, m, "/notool guest")
    revoked = await owner.call(
        "session_access/revoke",
        {"sessionId": m.session_id, "entryId": granted["result"]["entry"]["entryId"]},
    )
    assert "result" in revoked, revoked
    again = await elsewhere.call("session/prompt", _prompt(m.session_id, "/notool no", "g2"), WAIT)
    _forbidden(again, "session.write")
    # The guest was told of each change, never whom it named.
    assert m.guest_subject not in json.dumps(guest.updates(m.session_id))


async def _detach_mid_way(
    m: Matrix, owner: RawClient, drafter: RawClient
) -> tuple[dict[str, Any], int, list[str]]:
    """Detach: a draft client attaches, follows a turn, detaches (twice: a no-op); the
    session runs on without it. Returns its attachment, the last seq it was sent (its
    cursor) and the prompts it was shown."""
    attached = await _attach(m, drafter, ["events"])
    # Its roles: its credential's and the session's ACL's (it made the session: owner).
    assert attached["roles"] == ["approver", "controller", "owner"], attached
    await _turn(owner, m, "/notool one")
    await drafter.read_until(lambda: "/notool one" in window_texts(drafter, m.session_id), WAIT)
    detach = {**attach_params(m.session_id), "attachmentId": attached["attachmentId"]}
    assert (await drafter.call("session/detach", detach, WAIT))["result"] == {}
    cursor = _seqs(drafter, m.session_id)[-1]
    assert (await drafter.call("session/detach", detach, WAIT))["result"] == {}
    await _turn(owner, m, "/notool two")
    assert "result" in await drafter.call("session/list", {}, WAIT)  # orders what came before
    assert _seqs(drafter, m.session_id)[-1] == cursor, "delivery stopped at the detach"
    return attached, cursor, window_texts(drafter, m.session_id)


async def _private_state(m: Matrix, other: RawClient, attached: dict[str, Any]) -> None:
    """Private state: one attachment is its connection's; another can neither detach it
    nor cross its barrier (refused ``forbidden``, telling nothing of it)."""
    foreign = {**attach_params(m.session_id), "attachmentId": attached["attachmentId"]}
    refused = await other.call("session/detach", foreign, WAIT)
    assert _condition(refused) == "forbidden", refused
    refused = await other.call("session/ready", ready_params(m.session_id, attached), WAIT)
    assert _condition(refused) == "forbidden", refused


async def _reattach(
    m: Matrix, drafter: RawClient, cursor: int, old: dict[str, Any], seen: list[str]
) -> None:
    """After the fault, a new connection re-attaches from its cursor: a new attachment id,
    the replay strictly after the cursor, every prompt once overall."""
    attached = await _attach(m, drafter, ["events"], after=cursor)
    assert attached["attachmentId"] != old["attachmentId"]
    ran = [e.body["promptId"] for e in await m.events() if e.type == EventType.PROMPT]
    assert ran == list(TURNS.values()), ran
    await drafter.read_until(
        lambda: len(seen) + len(window_texts(drafter, m.session_id)) >= len(TURNS), WAIT
    )
    seqs = _seqs(drafter, m.session_id)
    assert seqs and seqs[0] > cursor and seqs == sorted(seqs), seqs
    # Each update once (a prompt's event is two: the user's message and the state).
    sent = [json.dumps(u, sort_keys=True) for u in drafter.updates(m.session_id)]
    assert len(sent) == len(set(sent)), sent
    assert seen + window_texts(drafter, m.session_id) == list(TURNS)


@pytest.mark.parametrize("fault", FAULTS)
async def test_roles_attachments_and_presence_through_a_fault(tmp_path: Path, fault: str) -> None:
    env = {"ACP_BROKER_PRESENCE_TTL": str(PRESENCE_TTL)}
    async with matrix(tmp_path, hosts=2 if fault == "host" else 1, front_env=env) as m:
        owner = await m.join(1, remote=False, name="Owner")  # front 1 lives through each fault
        created = await owner.call("session/new", {"cwd": CWD, "mcpServers": []}, WAIT)
        m.session_id = created["result"]["sessionId"]
        follower = await m.join(1, version=2, name="Follower", resume=False)
        await _attach(m, follower, ["events", "presence"])
        guest = await m.join(0, token=m.guest, name="Guest")
        drafter = await m.join(0, version=2, name="Drafter", resume=False)
        await _roles_before_the_fault(m, owner, guest)
        attached, cursor, seen = await _detach_mid_way(m, owner, drafter)
        await _private_state(m, follower, attached)
        await drafter.close()
        shown = await _presence_is(m, 1, ["Follower", "Guest", "Owner"])
        [entry] = [p for p in shown["participants"] if p["displayName"] == "Guest"]
        assert entry["roles"] == ["observer"], entry

        await _fault(m, fault)

        live = 1 if fault == "front" else 0
        elsewhere = guest
        if fault == "front":  # the guest reconnects to the other front
            guest = elsewhere = await m.join(1, token=m.guest, name="Guest")
        else:
            guest = await m.join(1, token=m.guest, name="Guest 2")
        await _roles_after_the_fault(m, owner, guest, elsewhere)
        drafter = await m.join(live, version=2, name="Drafter", resume=False)
        await _reattach(m, drafter, cursor, attached, seen)
        windows = ["Drafter", "Follower", "Guest", "Owner"]
        if fault != "front":
            windows.append("Guest 2")
        shown = await _presence_is(m, 1, windows)
        _nothing_private(m, shown)
        _nothing_private(
            m, {"participants": [d.get("participant", {}) for d in deltas(follower, m.session_id)]}
        )

        # The follower was sent each change: the drafter's coming, leaving and coming back,
        # the guests' (the killed front's guest leaving after its TTL).
        def drafts() -> list[str]:
            return [c for c, name in _presence(follower, m.session_id) if name == "Drafter"]

        await follower.read_until(lambda: drafts() == ["joined", "left", "joined"], WAIT)
        assert ("joined", "Guest") in _presence(follower, m.session_id)
        if fault == "front":  # the lapsed entry's leaving, logged by the live front's sweep
            await follower.read_until(
                lambda: ("left", "Guest") in _presence(follower, m.session_id), PRESENCE_TTL + WAIT
            )
        await _private_state(m, drafter, attached)  # the same principal's other attachment
        for client in {id(c): c for c in (owner, follower, guest, elsewhere, drafter)}.values():
            await client.close()
