"""What an archived session leaves in Redis (``docs/redis-memory.md``): its snapshot (a
listpack) and metadata, its index rows and entries; no log, no lease; command streams keep
only what their readers have not read; archiving failures are logged in one line."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.ops import metrics
from broker.serve import Broker
from broker.store.archive import DirectoryArchive
from broker.store.client import connect
from broker.store.index import SessionIndex, Version
from broker.store.keys import SessionKeys, TenantKeys, host_queue, leases_key, session_member
from broker.store.log import SessionLog, new_session_id
from workers.agent_host import streams
from workers.agent_host.streams import trim_inbox, trim_queue
from workers.projector.archiving import Archiver, run_archiving

from .conftest import make_settings
from .support.client import acp_client, wait_for
from .support.nodes import all_left
from .support.redis_server import restartable_redis
from .test_archive import archive_now

TENANT = "default"
GROUP = "hosts"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client = connect(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def broker(redis: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Broker]:
    """A broker on a real Redis whose host renews leases three times a second and trims its
    command streams five times a second."""
    monkeypatch.setattr(streams, "TRIM_INTERVAL", 0.2)
    node = Broker(make_settings(lease_ttl=1.0), redis=redis)
    await node.start()
    yield node
    await node.stop()


async def _session_keys(redis: Any, keys: SessionKeys) -> set[str]:
    base = keys.snapshot.removesuffix(":snap")
    return {key async for key in redis.scan_iter(match=f"{base}:*")}


async def test_an_archived_session_keeps_a_compact_snapshot_and_no_lease(
    broker: Broker, redis: Any
) -> None:
    client = await acp_client(f"ws://127.0.0.1:{broker.port}/acp")
    session_id = await client.new(cwd="/tmp/project", team="payments", ticket=4711)
    await client.prompt(session_id, "/notool a first prompt")
    keys = SessionKeys(TENANT, session_id)
    assert await redis.exists(keys.meta)
    assert await redis.get(keys.lease), "the host holds the session while it runs"
    await client.close()
    # The window's leaving (presence, logged after the fact) is in the log before it is kept.
    await wait_for(lambda: all_left(broker, session_id), what="the window's leaving logged")
    hot_log = await broker.log.read(TENANT, session_id)

    await archive_now(broker, session_id)

    async def let_go() -> bool:
        member = session_member(TENANT, session_id)
        return (
            not await redis.exists(keys.lease) and await redis.zscore(leases_key(), member) is None
        )

    await wait_for(let_go, 10.0, "the host to give the archived session's lease up")
    # The snapshot alone: the metadata went into it (``m:<name>``).
    assert await _session_keys(redis, keys) == {keys.snapshot}
    assert await redis.object("encoding", keys.snapshot) == "listpack"
    assert await redis.hget(keys.snapshot, "calls") is None
    assert await redis.hmget(keys.snapshot, "tenant", "sid") == [None, None]  # the key's
    archived = await broker.log.snapshot(TENANT, session_id)
    assert archived.session_id == session_id
    assert archived.meta == {"team": "payments", "ticket": 4711}
    version = Version.decode(await redis.hget(TenantKeys(TENANT).versions, session_id))
    assert version is not None and version.seq == len(hot_log)
    row = await SessionIndex(redis).row(TENANT, session_id)
    assert row is not None and row["title"] == "/notool a first prompt"

    # Reopened: the log comes back whole, the next seqs follow, the epoch is the same, and
    # the host that took the session back keeps its lease.
    reader = await acp_client(f"ws://127.0.0.1:{broker.port}/acp")
    await reader.conn.load_session(session_id=session_id, cwd="/tmp/project", mcp_servers=[])
    reply = await reader.prompt(session_id, "/notool after the archive")
    assert reply.stop_reason == "end_turn"
    whole = await broker.log.read(TENANT, session_id)
    assert whole[: len(hot_log)] == hot_log
    assert [e.seq for e in whole] == list(range(1, len(whole) + 1))
    assert {e.epoch for e in whole} == {hot_log[0].epoch}
    assert await redis.hget(keys.snapshot, "archived") is None
    assert await redis.hget(keys.snapshot, "archivedFence") is None
    assert await redis.hgetall(keys.meta) == {"team": '"payments"', "ticket": "4711"}
    assert not [name for name in await redis.hkeys(keys.snapshot) if name.startswith("m:")]
    assert (await broker.log.snapshot(TENANT, session_id)).meta["ticket"] == 4711
    assert await redis.get(keys.lease)
    await reader.close()


async def test_the_host_trims_its_inbox_and_the_queue(broker: Broker, redis: Any) -> None:
    client = await acp_client(f"ws://127.0.0.1:{broker.port}/acp")
    for _ in range(3):
        session_id = await client.new(cwd="/tmp/project")
        await client.prompt(session_id, "/notool a prompt")
    assert broker.worker is not None
    inbox = broker.worker.inbox

    async def trimmed() -> bool:
        return await redis.xlen(host_queue()) == 0 and await redis.xlen(inbox) == 0

    await wait_for(trimmed, 10.0, "the command streams to be trimmed")
    assert 0 < await redis.pttl(inbox) <= streams.INBOX_TTL * 1000
    # Trimmed streams go on carrying commands.
    other = await client.new(cwd="/tmp/project")
    await client.prompt(other, "/notool another prompt")
    await client.close()


async def _added(redis: Any, stream: str, count: int) -> list[str]:
    return [await redis.xadd(stream, {"m": f"command {i}"}) for i in range(count)]


async def test_the_queue_keeps_what_is_not_acknowledged(redis: Any) -> None:
    await redis.xgroup_create(host_queue(), GROUP, id="0", mkstream=True)
    ids = await _added(redis, host_queue(), 250)
    await redis.xreadgroup(GROUP, "host-a", {host_queue(): ">"}, count=1000)
    await redis.xack(host_queue(), GROUP, *ids[:180])
    await trim_queue(redis, GROUP)
    left = [entry_id for entry_id, _ in await redis.xrange(host_queue())]
    assert set(ids[180:]) <= set(left), "a command not acknowledged was trimmed"
    assert len(left) - 70 < 100, "more than a stream node of acknowledged commands stayed"
    await redis.xack(host_queue(), GROUP, *ids[180:])
    await trim_queue(redis, GROUP)
    assert await redis.xlen(host_queue()) == 0


async def test_a_command_whose_acknowledgement_failed_does_not_hold_the_trim(
    redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    await redis.xgroup_create(host_queue(), GROUP, id="0", mkstream=True)
    await _added(redis, host_queue(), 5)
    await redis.xreadgroup(GROUP, "host-a", {host_queue(): ">"}, count=10)  # never acked
    await trim_queue(redis, GROUP)
    assert await redis.xlen(host_queue()) == 5, "a pending command went before the horizon"
    with caplog.at_level(logging.INFO, logger=streams.__name__):
        await trim_queue(redis, GROUP, horizon=-1.0)
    assert await redis.xlen(host_queue()) == 0
    assert (await redis.xpending(host_queue(), GROUP))["pending"] == 0
    assert "acknowledged 5 queued commands" in caplog.text


async def test_an_inbox_is_trimmed_up_to_what_its_host_read(redis: Any) -> None:
    inbox = "acpb:host:host-test:inbox"
    ids = await _added(redis, inbox, 300)
    assert await trim_inbox(redis, inbox, None) == 0
    await trim_inbox(redis, inbox, ids[219])
    left = [entry_id for entry_id, _ in await redis.xrange(inbox)]
    assert set(ids[220:]) <= set(left), "a command not read yet was trimmed"
    assert len(left) - 80 < 100
    assert 0 < await redis.pttl(inbox) <= streams.INBOX_TTL * 1000
    await trim_inbox(redis, inbox, ids[-1])
    assert await redis.xlen(inbox) == 0


async def test_an_archiving_failure_is_one_line(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with restartable_redis(aof=False) as server:
        redis = connect(server.url)
        session_log = SessionLog(redis)
        session_id = new_session_id()
        await session_log.create(TENANT, session_id, {"type": "created", "cwd": "/work"})
        archiver = Archiver(redis, DirectoryArchive(tmp_path), session_log=session_log)
        errors = metrics.REDIS_ERRORS.labels("archiving")
        counted = errors._value.get()
        caplog.set_level(logging.INFO, logger="workers.projector.archiving")
        server.kill()  # Redis goes away while the role archives
        task = asyncio.create_task(
            run_archiving(archiver, archive_after=3600, deleted_retention=3600, interval=0.02)
        )
        try:
            await wait_for(lambda: errors._value.get() >= counted + 5, 20.0, "5 failed rounds")
            failures = [r for r in caplog.records if r.name == "workers.projector.archiving"]
            assert len(failures) == 1, [r.getMessage() for r in failures]
            [failure] = failures
            assert failure.levelno == logging.ERROR and failure.exc_info is None
            # The store's own class, then the client's words it wraps (one line either way).
            assert failure.getMessage().startswith(
                "archiving failed: StoreConnectionLost: ConnectionError"
            )
            assert "\n" not in failure.getMessage()
            server.start()
            await wait_for(lambda: "archiving recovered" in caplog.text, 20.0, "a recovery line")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await redis.aclose()


def test_versions_are_stored_compactly_and_read_in_either_form() -> None:
    sid = "sess_39b2c93f25a2fdf02abf25fccde733a9"
    updated, created = f"8203691218538:{sid}", f"8203691218566:{sid}"
    entries = {"acp": updated, "acp:cwd:a0": updated, "c": created, "c:id:3": created}
    version = Version(102, entries)
    text = version.encode()
    assert text == f"~102:{sid}\x1d8203691218538\x1eacp acp:cwd:a0\x1d8203691218566\x1ec c:id:3"
    assert Version.decode(text) == version
    assert Version.decode(json.dumps({"q": 102, "e": entries})) == version  # written before
    for odd in (
        Version(0, {}),
        Version(3, {"a": "bare-position"}),
        Version(3, {"a": "1:x", "b": "2:y"}),
        Version(3, {"a": "1:x", "b": "2:x:z"}),
        Version(3, {"a name with spaces": "1:x"}),
    ):
        assert Version.decode(odd.encode()) == odd
    assert Version.decode("~not a number\x1dx\x1ey") is None
    assert Version.decode("~3\x1dno names mark") is None


async def test_long_metadata_keeps_its_own_hash_when_archived(broker: Broker, redis: Any) -> None:
    client = await acp_client(f"ws://127.0.0.1:{broker.port}/acp")
    note = "a note far longer than a listpack value may be, " * 3
    session_id = await client.new(cwd="/tmp/project", note=note)
    await client.prompt(session_id, "/notool a prompt")
    await client.close()
    await archive_now(broker, session_id)
    keys = SessionKeys(TENANT, session_id)
    assert await _session_keys(redis, keys) >= {keys.snapshot, keys.meta}
    assert await redis.object("encoding", keys.snapshot) == "listpack"
    assert (await broker.log.snapshot(TENANT, session_id)).meta == {"note": note}


async def test_a_client_connected_through_the_archive_prompts_on(
    broker: Broker, redis: Any
) -> None:
    client = await acp_client(f"ws://127.0.0.1:{broker.port}/acp")
    session_id = await client.new(cwd="/tmp/project")
    await client.prompt(session_id, "/notool before")
    keys = SessionKeys(TENANT, session_id)
    await archive_now(broker, session_id)

    async def let_go() -> bool:
        return not await redis.exists(keys.lease)

    await wait_for(let_go, 10.0, "the host to give the archived session's lease up")
    reply = await client.prompt(session_id, "/notool after")
    assert reply.stop_reason == "end_turn"
    assert await redis.get(keys.lease)
    seqs = [e.seq for e in await broker.log.read(TENANT, session_id)]
    assert seqs == list(range(1, len(seqs) + 1))
    await client.close()
