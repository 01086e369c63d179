"""Deleted sessions are purged after their retention; the bounds stop runaways; a full Redis
refuses writes cleanly and keeps serving reads.

- purge: a deleted session is listed DELETED until ``deleted_retention`` has passed, then
  its log, snapshot, metadata, index rows and archive are gone; purging again does nothing.
- ``max_events_per_session``: appends past it fail with :class:`SessionFull`, the broker's
  own bookkeeping still lands; an agent that runs away is stopped with a notice.
- ``max_sessions_per_tenant``: ``session/new`` past it is a clear error.
- ``maxmemory``: a private redis-server with a small limit and ``noeviction``; once it is
  full, prompts and ``session/new`` fail saying the store is full, nothing is half-written,
  ``session/list`` and the REST list keep working, ``/readyz`` stays 200 saying "store full",
  and writes resume once space is freed.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError

from broker.serve import Broker
from broker.store.archive import DirectoryArchive
from broker.store.client import commands, connect
from broker.store.events import EventType
from broker.store.keys import SessionKeys, TenantKeys
from broker.store.log import SessionFull, SessionLog
from workers.projector.archiving import Archiver

from .conftest import make_settings
from .support.client import acp_client
from .support.redis_server import redis_server
from .test_archive import TENANT, archive_now, chunk, make_session


async def test_deleted_sessions_are_purged_after_retention(broker: Broker, url: str) -> None:
    client = await acp_client(url)
    kept = await client.new(cwd="/tmp/kept")
    gone = await client.new(cwd="/tmp/gone")
    await client.prompt(gone, "/notool soon deleted")
    await archive_now(broker, gone)  # its archive goes too
    await client.request("session/delete", {"sessionId": gone})
    rows = TenantKeys(TENANT).rows
    assert await commands(broker.redis).hexists(rows, gone)  # listed DELETED until purged
    assert broker.archive is not None
    archiver = Archiver(broker.redis, broker.archive, session_log=broker.log)

    assert (await archiver.purge_round(3600)).sessions == 0  # not due yet
    assert (await archiver.purge_round(0, dry_run=True)).sessions == 1
    assert await commands(broker.redis).exists(SessionKeys(TENANT, gone).snapshot)
    assert (await archiver.purge_round(0)).sessions == 1
    keys = SessionKeys(TENANT, gone)
    assert not await commands(broker.redis).exists(keys.log, keys.snapshot, keys.meta)
    assert not await commands(broker.redis).hexists(rows, gone)
    assert await broker.archive.get(TENANT, gone) is None
    assert (await archiver.purge_round(0)).sessions == 0  # idempotent
    assert await commands(broker.redis).hexists(rows, kept)
    with pytest.raises(RequestError) as err:
        await client.conn.load_session(session_id=gone, cwd="/tmp/gone", mcp_servers=[])
    assert err.value.code == -32002
    await client.close()


async def test_the_event_bound_keeps_room_for_bookkeeping(store: Any) -> None:
    session_log = SessionLog(store, max_events=10)
    session_id, _ = await make_session(session_log, 9)  # created + 9 = 10 events
    with pytest.raises(SessionFull, match="limit of 10 events"):
        await session_log.append(TENANT, session_id, chunk(10))
    notice = {"type": EventType.NOTICE, "text": "full"}
    assert (await session_log.append(TENANT, session_id, notice)).seq == 11
    deleted = {"type": EventType.DELETED}
    assert (await session_log.append(TENANT, session_id, deleted)).seq == 12
    [result] = await session_log.append_many([(TENANT, session_id, chunk(11), "")])
    assert isinstance(result, SessionFull)


async def test_a_runaway_agent_is_stopped_with_a_notice(store: Any) -> None:
    node = Broker(make_settings(max_events_per_session=40, cancel_grace=1.0), redis=store)
    await node.start()
    try:
        client = await acp_client(f"ws://127.0.0.1:{node.port}/acp")
        session_id = await client.new(cwd="/tmp/runaway")
        await asyncio.wait_for(client.prompt(session_id, "/chunks 500"), 30)
        events = await node.log.read(TENANT, session_id)
        assert 40 <= len(events) <= 40 + 16
        notices = [e for e in events if e.type == EventType.NOTICE]
        assert notices and "event limit" in notices[0].body["text"]
        with pytest.raises(RequestError) as err:
            await client.prompt(session_id, "/notool more")
        assert "the session is full" in str(err.value)
        await client.close()
    finally:
        await node.stop()


async def test_the_tenant_bound_refuses_new_sessions(store: Any) -> None:
    node = Broker(make_settings(max_sessions_per_tenant=2), redis=store)
    await node.start()
    try:
        client = await acp_client(f"ws://127.0.0.1:{node.port}/acp")
        await client.new(cwd="/tmp/one")
        await client.new(cwd="/tmp/two")
        with pytest.raises(RequestError) as err:
            await client.new(cwd="/tmp/three")
        assert err.value.code == -32600
        assert "max_sessions_per_tenant is 2" in str(err.value)
        await client.close()
    finally:
        await node.stop()


async def test_a_full_redis_refuses_writes_and_keeps_reads(tmp_path: Path) -> None:
    with redis_server("--maxmemory", "64mb", "--maxmemory-policy", "noeviction") as redis_url:
        node = Broker(make_settings(redis_url=redis_url))
        await node.start()
        filler = connect(redis_url)
        try:
            client = await acp_client(f"ws://127.0.0.1:{node.port}/acp")
            session_id = await client.new(cwd="/tmp/full")
            await client.prompt(session_id, "/notool before the store filled up")
            before = await node.log.read(TENANT, session_id)
            await _fill(filler)

            with pytest.raises(RequestError) as err:
                await client.prompt(session_id, "/notool refused")
            assert "store is full" in str(err.value)
            with pytest.raises(RequestError) as err:
                await client.new(cwd="/tmp/refused")
            assert "store is full" in str(err.value)
            snapshot = await node.log.snapshot(TENANT, session_id)
            assert await node.log.read(TENANT, session_id) == before  # nothing half-written
            assert snapshot.seq == before[-1].seq

            listed = await client.conn.list_sessions()  # reads keep working
            assert session_id in [s.session_id for s in listed.sessions]
            rest = f"http://127.0.0.1:{node.http_port}/v1/sessions"
            with await asyncio.to_thread(urllib.request.urlopen, rest, timeout=10) as answer:
                assert session_id in answer.read().decode()
            # Every node shares a full store and reads still work: ready, saying so.
            ready = f"http://127.0.0.1:{node.http_port}/readyz"
            with await asyncio.to_thread(urllib.request.urlopen, ready, timeout=10) as answer:
                report = json.loads(answer.read())
            assert report["status"] == "ok", report
            assert "store full" in report["checks"]["redis"]["note"], report
            metrics = await _metrics(f"http://127.0.0.1:{node.http_port}/metrics")
            assert metrics["acp_broker_store_full"] == 1  # the metrics say why too
            assert metrics["acp_broker_writes_refused_total{reason=store_full}"] >= 2

            await _drain(filler)
            with await asyncio.to_thread(urllib.request.urlopen, ready, timeout=10) as answer:
                report = json.loads(answer.read())
                assert report["status"] == "ok" and "note" not in report["checks"]["redis"]
            reply = await client.prompt(session_id, "/notool space again")
            assert reply.stop_reason == "end_turn"
            await client.close()
        finally:
            await filler.aclose()
            await node.stop()


async def _metrics(url: str) -> dict[str, float]:
    """The samples of ``/metrics``, keyed ``name{label=value,…}`` (parsed by prometheus-client)."""
    from prometheus_client.parser import text_string_to_metric_families

    with await asyncio.to_thread(urllib.request.urlopen, url, timeout=10) as answer:
        text = answer.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


async def _fill(redis: Any) -> None:
    """Make Redis full: its limit set below what it holds, as filled up by data would."""
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", used // 2)
    with pytest.raises(Exception, match="maxmemory"):
        await redis.set("filler", "x")


async def _drain(redis: Any) -> None:
    await redis.config_set("maxmemory", "64mb")


async def test_directory_archive_is_atomic(tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path)
    await archive.put("t/1", "s 1", b"first")
    await archive.put("t/1", "s 1", b"second")
    assert await archive.get("t/1", "s 1") == b"second"
    assert [p.name for p in archive.path("t/1", "s 1").parent.iterdir()] == ["s%201.log.z"]
    await archive.delete("t/1", "s 1")
    await archive.delete("t/1", "s 1")
    assert await archive.get("t/1", "s 1") is None
