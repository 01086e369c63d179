"""Projecting a batch of sessions at once (the projector's path) leaves the index exactly as
projecting each alone does, including when another writer comes between."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from broker.store.events import EventType
from broker.store.index import SessionIndex
from broker.store.keys import TenantKeys
from broker.store.log import SessionLog, new_session_id

TENANTS = ("acme", "globex")


@pytest.fixture(params=["redis", "embedded", "cluster"])
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
    snapshots = await log.snapshots([("acme", good), ("acme", bad)])
    assert None not in snapshots
    broken = dataclasses.replace(snapshots[1], updated_ms="soon")  # type: ignore[arg-type]
    failed = await index.project_many([snapshots[0], broken])
    assert [snapshot.session_id for snapshot, _ in failed] == [bad]
    assert await index.row("acme", good) is not None
    assert await index.row("acme", bad) is None


async def test_snapshots_of_missing_sessions_are_none(store: Any) -> None:
    assert await SessionLog(store).snapshots([("acme", new_session_id())]) == [None]
