"""What broker/compat/redis.py assumes of redis-py, checked by behaviour on a real
redis-server: every command and pipeline takes its connection with the pool's
``get_connection``, and a ``get_connection`` cancelled while it waits for a free connection
leaves the pool whole; and what the store's breaker does with it: no command waits for a
connection while the store is known away, and those waiting when it opens are released."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.compat.redis import GatedPool
from broker.store.breaker import StoreAway, StoreBreaker
from broker.store.client import commands
from broker.store.cluster import patient_cluster

from .support.client import LOADED_WAIT, wait_for


class CountingPool(GatedPool):
    """A gated pool that counts the calls of its ``get_connection``. Nothing a command does
    before the pool's wait for a free connection suspends it: a command counted here and not
    done (once the test's own task ran again) waits for a connection."""

    taken = 0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.taken += 1
        return await super().get_connection(*args, **kwargs)


async def test_every_command_and_pipeline_takes_its_connection_from_the_pool(
    redis_url: str,
) -> None:
    pool = CountingPool.from_url(redis_url, max_connections=2, timeout=5)
    client = Redis.from_pool(pool)
    try:
        before = pool.taken
        await client.set("acpb:{compat}:k", "1")
        await client.execute_command("GET", "acpb:{compat}:k")
        async with client.pipeline(transaction=False) as pipe:
            pipe.get("acpb:{compat}:k")
            await pipe.execute()
        assert pool.taken - before == 3
    finally:
        await client.aclose()


async def test_a_wait_for_a_connection_cancelled_leaves_the_pool_whole(redis_url: str) -> None:
    pool = CountingPool.from_url(redis_url, max_connections=1, timeout=LOADED_WAIT)
    client = Redis.from_pool(pool)
    try:
        held = await pool.get_connection()
        waiting = asyncio.ensure_future(pool.get_connection())
        await wait_for(lambda: pool.taken == 2, what="the second take to wait for the pool")
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await pool.release(held)
        assert await asyncio.wait_for(client.ping(), 5)  # the one connection is free again
    finally:
        await client.aclose()


async def test_the_breaker_releases_the_commands_waiting_for_a_connection(redis_url: str) -> None:
    breaker = StoreBreaker()
    pool = CountingPool.from_url(
        redis_url, max_connections=1, timeout=LOADED_WAIT, socket_timeout=5
    )
    pool.gate = breaker
    client = Redis.from_pool(pool)
    try:
        held = await pool.get_connection()  # every connection taken (a stalled command's)
        waiting = [asyncio.ensure_future(client.get("acpb:{compat}:k")) for _ in range(5)]
        await wait_for(lambda: pool.taken == 6, what="the five commands to wait for the pool")
        assert not any(w.done() for w in waiting)
        opened = time.monotonic()
        breaker.open(RedisTimeoutError("no answer to PING for 2 s"))
        results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 2)
        assert time.monotonic() - opened < 1.0
        assert all(isinstance(r, StoreAway) for r in results), results
        with pytest.raises(StoreAway):  # and while away, none waits at all
            await asyncio.wait_for(client.get("acpb:{compat}:k"), 1)
        await pool.release(held)
        breaker.close()
        assert await asyncio.wait_for(client.ping(), 5)  # back: served as before
    finally:
        await client.aclose()


async def test_a_command_cancelled_by_its_owner_is_not_taken_for_the_breakers(
    redis_url: str,
) -> None:
    breaker = StoreBreaker()
    pool = CountingPool.from_url(redis_url, max_connections=1, timeout=LOADED_WAIT)
    pool.gate = breaker
    client = Redis.from_pool(pool)
    try:
        held = await pool.get_connection()
        waiting = asyncio.ensure_future(client.get("acpb:{compat}:k"))
        await wait_for(lambda: pool.taken == 2, what="the command to wait for the pool")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await pool.release(held)
        assert await asyncio.wait_for(client.ping(), 5)
    finally:
        await client.aclose()


async def test_the_breaker_releases_a_cluster_command_opening_a_connection() -> None:
    """A cluster's nodes wait for no pool (past their free connections each command opens
    one), but opening one to a stalled server hangs in its handshake up to the connect
    timeout: the breaker opening releases such a command at once, as the pool's waiters,
    and the half-open connection is closed."""
    accepted: list[asyncio.StreamWriter] = []
    asked: list[bytes] = []
    closed: list[bytes] = []

    async def stalled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # answers nothing: a stopped server
        asked.append(await reader.read(1))  # the handshake's first command: now it waits
        closed.append(await reader.read())  # what the client sent, once it closed

    server = await asyncio.start_server(stalled, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    breaker = StoreBreaker()
    client = patient_cluster(
        f"redis://127.0.0.1:{port}",
        patience=1.0,
        gate=breaker,
        socket_timeout=20,
        socket_connect_timeout=20,
    )
    try:
        waiting = asyncio.ensure_future(commands(client).get("acpb:{compat}:k"))
        await wait_for(lambda: any(asked), what="the handshake's first command")
        assert not waiting.done()  # hanging in its handshake, which no reply ends
        opened = time.monotonic()
        breaker.open(RedisTimeoutError("no answer to PING for 2 s"))
        with pytest.raises(StoreAway):
            await asyncio.wait_for(waiting, 2)
        assert time.monotonic() - opened < 1.0
        await wait_for(lambda: len(closed) == len(accepted), 5, "the connection closed")
    finally:
        breaker.close()
        await client.aclose()
        for writer in accepted:
            writer.close()
        server.close()
