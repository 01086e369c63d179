"""``redis_wait_replicas``: an append is acknowledged only once a replica has it.

A master and its replica (two redis-servers of the test's own): with a replica attached,
appends (one at a time and in a batch) land and are on the replica when they return; with
none, an append fails within ``redis_wait_timeout`` as not replicated (a store error the
agent host tries again), and trying it again with the same call id appends nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from acp import RequestError

from broker.serve import Broker
from broker.store.client import commands, connect
from broker.store.durability import NotReplicated
from broker.store.keys import session_keys
from broker.store.log import SessionLog
from broker.store.retry import STORE_AWAY

from .conftest import make_settings
from .support.client import acp_client
from .support.redis_server import master_with_replica, redis_server

REPLICA_ACK = 20.0
"""Seconds an append waits for a live replica's acknowledgement (``WAIT``'s timeout): a
bound on a loaded machine's replication, not an estimate of it, as ``WAIT`` returns as
soon as the replica has the entry."""
CREATED = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}
UPDATE = {"type": "update", "update": {"sessionUpdate": "agent_message_chunk"}}


@pytest.fixture
def master_and_replica() -> Iterator[tuple[str, str]]:
    with master_with_replica() as urls:
        yield urls


async def test_appends_return_once_the_replica_has_them(
    master_and_replica: tuple[str, str],
) -> None:
    master, replica = master_and_replica
    store = connect(master)
    log = SessionLog(store)
    log.wait_for_replicas(1, REPLICA_ACK)
    try:
        await log.create("t", "s", CREATED)
        one = await log.append("t", "s", UPDATE)
        many = await log.append_many([("t", "s", UPDATE, "")] * 3)
        assert one.seq == 2 and [p.seq for p in many] == [3, 4, 5]  # type: ignore[union-attr]
        with redis.Redis.from_url(replica) as reader:
            assert reader.xlen(session_keys("t", "s").log) == 5  # there when acknowledged
    finally:
        await store.aclose()


async def test_an_append_no_replica_acknowledged_fails_and_lands_once_when_tried_again() -> None:
    with redis_server() as alone:
        store = connect(alone)
        log = SessionLog(store)
        await log.create("t", "s", CREATED)
        log.wait_for_replicas(1, 0.3)
        try:
            started = time.monotonic()
            with pytest.raises(NotReplicated, match="0 of 1 replicas") as failed:
                await log.append("t", "s", UPDATE, call="c1")
            assert time.monotonic() - started < 2.0
            assert isinstance(failed.value, STORE_AWAY)  # told "try again", tried again
            with pytest.raises(NotReplicated):
                await log.append("t", "s", UPDATE, call="c1")
            assert await commands(store).xlen(session_keys("t", "s").log) == 2  # once
        finally:
            await store.aclose()


async def test_the_setting_reaches_every_append_of_a_broker(
    master_and_replica: tuple[str, str],
) -> None:
    """One replica: with ``redis_wait_replicas`` 1 a prompt is served; with 2, appends are
    not acknowledged and the client is told to try again (never "internal error").

    The served case allows the replica :data:`REPLICA_ACK`: on a loaded machine its
    acknowledgement can take seconds, the refused case waits 0.2 s for one that never comes.
    It keeps the default request timeout too: its ``session/new`` starts the demo agent,
    which takes several seconds on a loaded 2-core machine; the refused case is told within
    5 s."""
    master, _ = master_and_replica
    for wanted, served, timeout in ((1, True, REPLICA_ACK), (2, False, 0.2)):
        node = Broker(
            make_settings(
                redis_url=master,
                redis_wait_replicas=wanted,
                redis_wait_timeout=timeout,
                **({} if served else {"request_timeout": 5}),
            )
        )
        await node.start()
        try:
            client = await acp_client(f"ws://127.0.0.1:{node.port}/acp")
            try:
                if served:
                    session_id = await client.new(cwd="/durable")
                    reply = await client.prompt(session_id, "/notool kept")
                    assert reply.stop_reason == "end_turn"
                else:
                    with pytest.raises(RequestError) as failed:
                        await client.new(cwd="/not-durable")
                    assert "try again" in str(failed.value), failed.value
            finally:
                await client.close()
        finally:
            await node.stop()
