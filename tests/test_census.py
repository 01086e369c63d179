"""The store's census: sessions hot (their log in Redis) and archived, counted from the
partitions' hot sets and the tenants' index rows, and exported on ``/metrics``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.ops import metrics
from broker.serve import Broker
from broker.store.census import census
from workers.projector.archiving import count_sessions

from .conftest import make_settings
from .support.client import RawClient, text, wait_for
from .test_archive import archive_now


@pytest.fixture
def store_kind() -> str:
    return "redis"


async def test_hot_and_archived_sessions_are_counted_and_exported(
    store: Any, tmp_path: Path
) -> None:
    node = Broker(make_settings(archive_store=str(tmp_path)), redis=store)
    await node.start()
    try:
        client = await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp")
        sessions = []
        for index in range(3):
            session_id = await client.new_session("/census")
            prompt = {"sessionId": session_id, "prompt": text(f"/notool {index}")}
            assert "result" in await client.call("session/prompt", prompt)
            sessions.append(session_id)
        await client.close()

        async def indexed() -> bool:
            return (await census(store)).indexed == 3

        await wait_for(indexed, 30.0, "the projector to index the three sessions")
        counted = await census(store)
        assert (counted.hot, counted.archived) == (3, 0)
        for session_id in sessions[:2]:
            await archive_now(node, session_id)
        counted = await census(store)
        assert (counted.hot, counted.indexed, counted.archived) == (1, 3, 2)
        await count_sessions(store)
        exported = metrics.exposition()[0].decode()
        assert "acp_broker_sessions_hot 1.0" in exported
        assert "acp_broker_sessions_archived 2.0" in exported
    finally:
        await node.stop()
