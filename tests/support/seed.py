"""Sessions written straight to the store (logs, then projected), for list tests."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.store.client import Store
from broker.store.events import EventType, JsonObject, Status
from broker.store.index import SessionIndex, member
from broker.store.log import SessionLog, new_session_id

BASE_MS = 1_790_000_000_000


@dataclass(frozen=True)
class Seeded:
    """What a seeded session is, as the list should show it."""

    session_id: str
    status: str
    kind: str
    created_ms: int
    meta: JsonObject = field(default_factory=dict)
    cwd: str = "/seed"

    @property
    def member(self) -> str:
        return member(self.created_ms, self.session_id)


def newest_first(sessions: list[Seeded]) -> list[str]:
    """Session ids in list order: newest creation first, ties by id."""
    return [s.session_id for s in sorted(sessions, key=lambda s: s.member)]


async def seed_session(
    store: Store,
    *,
    tenant: str = "default",
    status: str = Status.RUNNING,
    kind: str = "combined",
    created_ms: int = BASE_MS,
    meta: JsonObject | None = None,
    cwd: str = "/seed",
    session_id: str | None = None,
) -> Seeded:
    """One session: its log (created, then a status or deleted event), projected."""
    log, index = SessionLog(store), SessionIndex(store)
    session_id = session_id or new_session_id()
    created: JsonObject = {
        "type": EventType.CREATED,
        "cwd": cwd,
        "agent": "demo",
        "kind": kind,
        "meta": meta or {},
    }
    await log.create(tenant, session_id, created)
    if status == Status.DELETED:
        await log.append(tenant, session_id, {"type": EventType.DELETED})
    elif status != Status.RUNNING:
        await log.append(tenant, session_id, {"type": EventType.STATUS, "status": status})
    snapshot = await log.snapshot(tenant, session_id)
    await index.project(dataclasses.replace(snapshot, created_ms=created_ms), force=True)
    return Seeded(session_id, status, kind, created_ms, meta or {}, cwd)


async def seed_many(
    store: Store, count: int, make: Callable[[int], dict[str, Any]], *, batch: int = 50
) -> list[Seeded]:
    """``count`` sessions, ``make(i)`` giving the keyword arguments of the i-th."""
    made: list[Seeded] = []
    for start in range(0, count, batch):
        chunk = range(start, min(count, start + batch))
        made += await asyncio.gather(*(seed_session(store, **make(i)) for i in chunk))
    return made
