"""A burst of concurrent store calls larger than the connection pool waits; it never fails."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection

from broker.store.client import POOL_SIZE, connect, packed_by_hiredis, server_client


async def test_more_concurrent_calls_than_connections_wait_for_one(redis_url: str) -> None:
    store: Any = connect(redis_url)
    try:
        # Each call holds a connection for 0.2 s; more than twice the pool at once.
        calls = [store.blpop([f"empty:{i}"], timeout=0.2) for i in range(2 * POOL_SIZE + 40)]
        results = await asyncio.gather(*calls)
        assert results == [None] * len(calls)
    finally:
        await store.aclose()


ARGUMENT = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"])),
    st.binary(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
)


@given(st.lists(ARGUMENT, min_size=1, max_size=6), st.sampled_from(["SET", "CONFIG SET"]))
def test_commands_are_packed_by_hiredis_to_the_bytes_redis_py_makes(
    args: list[Any], name: str
) -> None:
    python, hiredis = Connection(), packed_by_hiredis(Connection)()
    assert b"".join(hiredis.pack_command(name, *args)) == b"".join(python.pack_command(name, *args))
    commands = [(name, *args), ("GET", "k")]
    assert b"".join(hiredis.pack_commands(commands)) == b"".join(python.pack_commands(commands))


def test_a_store_packs_its_commands_with_hiredis(redis_url: str) -> None:
    store = server_client(connect(redis_url))
    assert issubclass(store.connection_pool.connection_class, packed_by_hiredis(Connection))
