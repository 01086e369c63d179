"""A projector that died between reading change notices and acknowledging them loses nothing:
the projector that runs next (a restarted ``serve``, another node) projects those sessions.

``serve`` starts its projector under a fresh random consumer name, so the notices the dead
one had read stay pending under *its* name; something must claim them.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from broker.store.events import EventType
from broker.store.index import SessionIndex
from broker.store.keys import PARTITIONS, feed_key
from broker.store.log import SessionLog, new_session_id
from workers.projector.worker import GROUP, Projector

from .support.client import wait_for

TENANT = "default"


async def test_notices_read_by_a_dead_projector_are_projected(store: Any) -> None:
    async with asyncio.timeout(20):
        session_log = SessionLog(store)
        index = SessionIndex(store)
        session_id = new_session_id()
        await session_log.create(
            TENANT,
            session_id,
            {"type": EventType.CREATED, "cwd": "/work/p", "agent": "demo", "kind": "combined"},
        )
        title = {"sessionUpdate": "session_info_update", "title": "projected at last"}
        await session_log.append(TENANT, session_id, {"type": EventType.UPDATE, "update": title})

        # A projector reads the notices, then dies before it acknowledges them.
        crashed = Projector(store, name="projector-crashed")
        await crashed.ensure_groups()
        streams = {feed_key(p): ">" for p in range(PARTITIONS)}
        read = await store.xreadgroup(GROUP, crashed.name, streams, count=100)
        assert any(entries for _, entries in read)
        assert await index.row(TENANT, session_id) is None

        # The next projector, named as serve names it.
        task = asyncio.create_task(Projector(store, block_ms=100, claim_idle_ms=200).run())
        try:
            # Bounded by wait_for alone: 3 s of a loaded 2-core machine can go to the new
            # projector's start (its groups, claims and backlog over 256 feeds).
            row = await wait_for(
                lambda: index.row(TENANT, session_id),
                what="the notices the dead projector read to be projected",
            )
            assert row["title"] == "projected at last"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
