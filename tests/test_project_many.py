"""Projecting a batch of sessions at once (the projector's path) leaves the index exactly as
projecting each alone does, including when another writer comes between."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import secrets
from typing import Any

import pytest

from broker.store.events import EventType, is_index_neutral
from broker.store.index import SessionIndex, Version, rfc3339
from broker.store.keys import SessionKeys, TenantKeys
from broker.store.log import SessionLog, new_session_id
from workers.projector.worker import Projector, _notice

from .support.client import wait_for
from .support.projection import feeds_of, until_consumed

TENANTS = ("acme", "globex")


@pytest.fixture(params=["redis", "embedded", "cluster", "sentinel"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _index_state(store: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for tenant in TENANTS:
        keys = TenantKeys(tenant)
        state[f"{tenant} rows"] = await store.hgetall(keys.rows)
        for name in ("acp", "c:/work/a", "c:/work/b"):
            state[f"{tenant} {name}"] = await store.zrange(keys.index(name), 0, -1)
    return state


async def test_a_batch_projects_as_each_alone_would(store: Any) -> None:
    log, batch, single = SessionLog(store), SessionIndex(store), SessionIndex(store)
    sessions = []
    for i in range(12):
        tenant, session_id = TENANTS[i % 2], new_session_id()
        cwd = "/work/a" if i % 3 else "/work/b"
        created = {"type": EventType.CREATED, "cwd": cwd, "agent": "demo", "kind": "combined"}
        await log.create(tenant, session_id, created)
        sessions.append((tenant, session_id))

    async def step(n: int) -> None:
        for k, (tenant, session_id) in enumerate(sessions):
            if (k + n) % 2:
                update = {"sessionUpdate": "session_info_update", "title": f"t{n}-{k}"}
                await log.append(tenant, session_id, {"type": EventType.UPDATE, "update": update})
        snapshots = [s for s in await log.snapshots(sessions) if s is not None]
        assert await batch.project_many(snapshots) == []

    await step(0)
    await step(1)
    # Another writer moves some sessions on between two batches: the batch's versions for
    # them are stale, and its writes must find out and project afresh.
    for tenant, session_id in sessions[:4]:
        await log.append(tenant, session_id, {"type": EventType.STATUS, "status": "STOPPED"})
        await single.project(await log.snapshot(tenant, session_id))
    await step(2)
    batched = await _index_state(store)

    for tenant in TENANTS:  # the same logs, projected one session at a time
        keys = TenantKeys(tenant)
        await store.delete(
            keys.rows, keys.versions, *(keys.index(n) for n in ("acp", "c:/work/a", "c:/work/b"))
        )
    for tenant, session_id in sessions:
        await single.project(await log.snapshot(tenant, session_id), force=True)
    assert await _index_state(store) == batched
    assert all(batched[f"{t} rows"] for t in TENANTS)


async def test_a_snapshot_that_cannot_be_rendered_is_reported_and_the_rest_projected(
    store: Any,
) -> None:
    log, index = SessionLog(store), SessionIndex(store)
    good, bad = new_session_id(), new_session_id()
    for session_id in (good, bad):
        created = {"type": EventType.CREATED, "cwd": "/work/a", "agent": "demo", "kind": "combined"}
        await log.create("acme", session_id, created)
    first, second = await log.snapshots([("acme", good), ("acme", bad)])
    assert first is not None and second is not None
    # Not a number, on purpose: the row of ``bad`` cannot be rendered.
    broken = dataclasses.replace(second, updated_ms="soon")  # type: ignore[arg-type]
    failed = await index.project_many([first, broken])
    assert [snapshot.session_id for snapshot, _ in failed] == [bad]
    assert await index.row("acme", good) is not None
    assert await index.row("acme", bad) is None


async def test_snapshots_of_missing_sessions_are_none(store: Any) -> None:
    assert await SessionLog(store).snapshots([("acme", new_session_id())]) == [None]


# The fast path: notices of events that change nothing the index shows but the seq and
# updatedAt are patched in (``SessionIndex.touch_many``, ``lua/touch.lua``) without reading
# snapshots. Drawn scenarios mix them with everything that does change a row or a listing,
# with raced writers, notices seen twice, restarts and removals; at the end the index must be
# exactly what projecting each session alone from its snapshot makes.

CHUNK: dict[str, Any] = {
    "type": EventType.UPDATE,
    "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}},
}


def _info(**fields: Any) -> dict[str, Any]:
    return {"type": EventType.UPDATE, "update": {"sessionUpdate": "session_info_update", **fields}}


def _event(rng: random.Random, n: int) -> dict[str, Any]:
    """A drawn event: mostly agent chunks, then everything else the log holds."""
    roll = rng.random()
    if roll < 0.55:
        return CHUNK
    choices: list[dict[str, Any]] = [
        {"type": EventType.NOTICE, "message": "hello"},
        {"type": EventType.STATE, "state": "requires_action"},
        {"type": EventType.PROMPT, "promptId": f"p{n}", "prompt": []},
        {"type": EventType.PROMPT_END, "promptId": f"p{n}", "stopReason": "end_turn"},
        {"type": EventType.BOUND, "agentSessionId": f"a{n}"},
        _info(title=f"title {n}"),
        _info(title=None),
        _info(updatedAt="2020-01-02T03:04:05.678Z"),
        _info(updatedAt=None),
        _info(_meta={"tag": f"w{n % 3}", "updatedAt": "1999"}),
        _info(_meta=None),
        {"type": EventType.STATUS, "status": rng.choice(["STOPPED", "ERROR", "RUNNING"])},
        {"type": EventType.DELETED},
    ]
    weights = [4, 3, 3, 3, 1, 2, 1, 1, 1, 1, 1, 2, 0.3]
    return rng.choices(choices, weights)[0]


async def _feed_since(store: Any, feeds: dict[str, str]) -> list[tuple[str, list[Any]]]:
    """Every notice appended to ``feeds`` since the ids noted there (which move on)."""
    replies = []
    for feed, last in feeds.items():
        entries = await store.xrange(feed, f"({last}" if last != "0" else "-", "+")
        if entries:
            feeds[feed] = entries[-1][0]
            replies.append((feed, entries))
    return replies


async def _whole_index(store: Any, tenant: str) -> dict[str, Any]:
    keys = TenantKeys(tenant)
    state: dict[str, Any] = {
        "rows": await store.hgetall(keys.rows),
        "versions": await store.hgetall(keys.versions),
    }
    for name in await store.keys(keys.index("*")):
        state[name] = await store.zrange(name, 0, -1)
    return state


def _split(rng: random.Random, replies: list[Any]) -> tuple[list[Any], list[Any]]:
    """Notices dealt between two readers at random, each keeping the feed's order."""
    mine: list[Any] = []
    theirs: list[Any] = []
    for feed, entries in replies:
        dealt = [rng.random() < 0.3 for _ in entries]
        mine.append((feed, [e for e, d in zip(entries, dealt, strict=True) if not d]))
        theirs.append((feed, [e for e, d in zip(entries, dealt, strict=True) if d]))
    return mine, theirs


def _counting(projector: Projector, touched: list[int]) -> Projector:
    """``projector``, noting in ``touched`` how many sessions each batch patched in place."""
    index, touch_many = projector.index, projector.index.touch_many

    async def counted(notices: Any) -> list[tuple[str, str]]:
        full = await touch_many(notices)
        touched.append(len(notices) - len(full))
        return full

    index.touch_many = counted  # type: ignore[method-assign]
    return projector


@pytest.mark.parametrize("seed", range(10))
async def test_neutral_notices_patch_the_index_as_a_full_projection_would(
    store: Any, seed: int
) -> None:
    rng = random.Random(seed)
    tenant = f"fast{seed}-{secrets.token_hex(3)}"
    log, other = SessionLog(store), SessionIndex(store)
    touched: list[int] = []
    projector, slow = _counting(Projector(store), touched), _counting(Projector(store), touched)
    sessions = [new_session_id() for _ in range(5)]
    feeds = {SessionKeys(tenant, s).feed: "0" for s in sessions}
    for k, session_id in enumerate(sessions):
        created: dict[str, Any] = {"type": EventType.CREATED, "cwd": f"/w/{k % 2}", "agent": "demo"}
        created |= {"kind": "combined", "meta": {"n": k}} if k % 2 else {}
        await log.create(tenant, session_id, created)
    previous: list[tuple[str, list[Any]]] = []
    for n in range(40):
        for _ in range(rng.randint(1, 8)):
            session_id = rng.choice(sessions)
            await log.append(tenant, session_id, _event(rng, n))
        batch = await _feed_since(store, feeds)
        roll = rng.random()
        if roll < 0.1:  # another projector moves a session on first
            await other.project(await log.snapshot(tenant, rng.choice(sessions)))
        elif roll < 0.15:  # a projector restarts: it knows no versions
            projector = _counting(Projector(store), touched)
        elif roll < 0.2:
            await projector.index.remove(tenant, rng.choice(sessions))
        elif roll < 0.3:
            batch = previous + batch  # notices seen again (claimed, or read twice)
        elif roll < 0.5:  # another projector of the group reads some of them, and is slower
            batch, theirs = _split(rng, batch)
            await projector._apply(batch)
            await slow._apply(theirs)
            previous = theirs
            continue
        await projector._apply(batch)
        previous = batch
    await projector._apply(await _feed_since(store, feeds))
    fast = await _whole_index(store, tenant)

    keys = TenantKeys(tenant)
    await store.delete(keys.rows, keys.versions, *await store.keys(keys.index("*")))
    alone = SessionIndex(store)
    for session_id in sessions:
        await alone.project(await log.snapshot(tenant, session_id), force=True)
    assert await _whole_index(store, tenant) == fast
    assert sum(touched) > 0  # the fast path was taken, and not only the full one


async def test_most_agent_updates_are_projected_without_a_snapshot(store: Any) -> None:
    log, projector = SessionLog(store), Projector(store)
    session_id, tenant = new_session_id(), "acme"
    feeds = {SessionKeys(tenant, session_id).feed: "0"}
    await log.create(tenant, session_id, {"type": EventType.CREATED, "cwd": "/w", "agent": "d"})
    await projector._apply(await _feed_since(store, feeds))
    for _ in range(3):
        await log.append(tenant, session_id, CHUNK)
    notices = [fields for _, entries in await _feed_since(store, feeds) for _, fields in entries]
    assert [set(f) for f in notices] == [{"t", "s", "q", "u"}] * 3
    touches = {(tenant, session_id): [_notice(f) for f in notices]}
    assert await projector.index.touch_many(touches) == []
    row = await projector.index.row(tenant, session_id)
    snapshot = await log.snapshot(tenant, session_id)
    assert row is not None and row["updatedAt"] == rfc3339(snapshot.updated_ms)
    # A notice an older broker wrote (no "u") is projected from the snapshot.
    await log.append(tenant, session_id, CHUNK)
    ((_, ((_, fields),)),) = await _feed_since(store, feeds)
    old = {k: v for k, v in fields.items() if k != "u"}
    assert await projector.index.touch_many({(tenant, session_id): [_notice(old)]}) == [
        (tenant, session_id)
    ]


def test_which_events_are_index_neutral() -> None:
    assert is_index_neutral(CHUNK)
    assert is_index_neutral({"type": EventType.PROMPT, "promptId": "p", "prompt": []})
    assert is_index_neutral({"type": EventType.NOTICE, "message": "m"})
    assert not is_index_neutral(_info(title="t"))
    assert not is_index_neutral(_info(_meta={"a": 1}))
    assert not is_index_neutral({"type": EventType.STATUS, "status": "STOPPED"})
    assert not is_index_neutral({"type": EventType.DELETED})
    assert not is_index_neutral({"type": EventType.CREATED, "cwd": "/", "agent": "d"})


async def test_a_running_projector_takes_agent_updates_in_place(
    store: Any, store_kind: str
) -> None:
    log, tenant, session_id = SessionLog(store), "acme", new_session_id()
    touched: list[int] = []
    projector = _counting(Projector(store, block_ms=100), touched)
    task = asyncio.create_task(projector.run())
    try:
        await log.create(tenant, session_id, {"type": EventType.CREATED, "cwd": "/w", "agent": "d"})
        for n in range(6):
            await log.append(tenant, session_id, _info(title=f"t{n}") if n == 3 else CHUNK)
            await _indexed(store, log, tenant, session_id)
        # The last batch is in the index before its touch_many returns (on a cluster, an
        # announcement later): cancelled before then, it would go uncounted.
        await until_consumed(store, feeds_of(tenant, [session_id]))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert sum(touched) >= 4  # the chunks after the creation and after the rename
    if store_kind == "redis":
        assert projector.reads.bare  # the feeds were read on the bare connection
    fast = await _whole_index(store, tenant)
    alone = SessionIndex(store)
    await alone.project(await log.snapshot(tenant, session_id), force=True)
    assert await _whole_index(store, tenant) == fast


async def _indexed(store: Any, log: SessionLog, tenant: str, session_id: str) -> None:
    """Wait (bounded) until the index holds the session's newest event."""
    seq = (await log.snapshot(tenant, session_id)).seq

    async def indexed() -> bool:
        version = Version.decode(await store.hget(TenantKeys(tenant).versions, session_id))
        return version is not None and version.seq >= seq

    await wait_for(indexed, what=f"the index to hold {session_id} at {seq}")
