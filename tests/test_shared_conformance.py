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

Left to the helpers building them (their places in this matrix):

* roles (observer, controller, approver, owner) beyond the read-only token's refusal;
* attach, the delivery barrier (``session/ready``) and detach;
* presence (snapshot, deltas, expiry across reconnect);
* controller lease transfer fencing and private state: not implemented.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.auth.tokens import TokenStore
from broker.protocol.render import QUEUE_META
from broker.protocol.turns import PROMPT_ID_META
from broker.store.client import commands, connect
from broker.store.events import EventType
from broker.store.keys import lease_key
from broker.store.log import SessionLog

from .support.client import RawClient, text, wait_for
from .support.redis_server import RestartableRedis, restartable_redis
from .test_interactions import ALLOW, asks, interaction_updates
from .test_scale_out import Deployment, _kill_holder, cluster_of

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
    """The deployment, its store, its two credentials (read-write, read-only), the session."""

    redis: RestartableRedis
    deployment: Deployment
    writer: str
    reader: str
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
        self, front: int, *, version: int = 1, remote: bool = True, token: str | None = None
    ) -> RawClient:
        """A connection on front ``front`` with the session resumed on it (the whole log
        replayed, for v1 a load)."""
        url = self.deployment.nodes[front].url
        headers = {"Authorization": f"Bearer {token or self.writer}"}
        client = await RawClient.connect(url, additional_headers=headers)
        caps = REMOTE if remote else {}
        field = "clientCapabilities" if version == 1 else "capabilities"
        init: dict[str, Any] = {"protocolVersion": version, field: caps}
        if version == 2:
            init["info"] = {"name": "conformance", "version": "1"}
        assert "result" in await client.call("initialize", init)
        if self.session_id:
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
async def matrix(tmp_path: Path, hosts: int) -> AsyncIterator[Matrix]:
    with restartable_redis(aof=True) as redis:
        store = connect(redis.url)
        tokens = TokenStore(store)
        writer, _ = await tokens.create(TENANT, ["read", "write"])
        reader, _ = await tokens.create(TENANT, ["read"])
        await store.aclose()
        auth = {"ACP_BROKER_AUTH": "on"}
        async with cluster_of(
            redis.url, tmp_path, fronts=2, hosts=hosts, front_env=auth
        ) as deployment:
            yield Matrix(redis, deployment, writer, reader)


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
