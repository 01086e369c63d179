"""A burst of concurrent store calls larger than the connection pool waits; it never fails."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.connection import Connection

from broker.compat.redis import packed_by_hiredis
from broker.store.client import POOL_SIZE, connect, server_client


async def test_more_concurrent_calls_than_connections_wait_for_one(redis_url: str) -> None:
    store: Any = connect(redis_url)
    try:
        # Each call holds a connection for 0.2 s; more than twice the pool at once.
        calls = [store.blpop([f"empty:{i}"], timeout=0.2) for i in range(2 * POOL_SIZE + 40)]
        results = await asyncio.gather(*calls)
        assert results == [None] * len(calls)
    finally:
        await store.aclose()


def test_a_store_packs_its_commands_with_hiredis(redis_url: str) -> None:
    store = server_client(connect(redis_url))
    assert issubclass(store.connection_pool.connection_class, packed_by_hiredis(Connection))
