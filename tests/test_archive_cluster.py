"""On a real Redis Cluster: archive, read, restore by a batch append and purge, every
script of theirs in one slot (each touches only its session's partition-tagged keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.store.archive import DirectoryArchive
from broker.store.events import EventType
from broker.store.keys import SessionKeys
from broker.store.log import Position, SessionLog
from workers.projector.archiving import Archiver

from .test_archive import TENANT, chunk, make_session


@pytest.fixture(params=["cluster"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_archive_restore_and_purge_on_a_cluster(store: Any, tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path)
    session_log = SessionLog(store, archive=archive)
    archiver = Archiver(store, archive, session_log=session_log)
    made = [await make_session(session_log, 8) for _ in range(6)]  # over several slots
    assert (await archiver.archive_round(0)).sessions == 6
    for session_id, before in made:
        assert not await store.exists(SessionKeys(TENANT, session_id).log)
        assert await SessionLog(store, archive=archive).read(TENANT, session_id) == before
    items = [(TENANT, session_id, chunk(9), "") for session_id, _ in made]
    results = await session_log.append_many(items)
    assert [r.seq for r in results if isinstance(r, Position)] == [10] * 6, results
    gone, _ = made[0]
    await session_log.append(TENANT, gone, {"type": EventType.DELETED})
    assert (await archiver.purge_round(0)).sessions == 1
    assert not await store.exists(SessionKeys(TENANT, gone).snapshot)
