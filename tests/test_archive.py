"""Archived sessions read, replay and take appends exactly as hot ones do.

A session's log is archived (moved out of Redis into the directory archive store) and
then read, resumed from positions, prompted and replayed in v1 and v2 windows: every
event compares equal, seq by seq, with the log before archiving, and an append after
archiving lands at the next seq of the same epoch. A damaged archive gives a clear error
and keeps the session archived; an append racing the archive keeps the log in Redis;
a kill -9 of the archiving role at every step loses nothing and doubles nothing.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.protocol.v2 import REPLAY_POSITION
from broker.serve import Broker
from broker.store import log as log_module
from broker.store.archive import ArchiveCorrupt, ArchivedLog, DirectoryArchive, decode, encode
from broker.store.client import commands
from broker.store.events import EventType, LogEvent
from broker.store.keys import SessionKeys
from broker.store.log import Position, SessionLog, new_session_id
from workers.projector.archiving import STOP_AT_ENV, Archiver

from .conftest import ROOT, subprocess_env
from .support.client import acp_client, wait_for
from .support.nodes import all_left
from .support.wire import CheckedClient
from .test_acp_v2 import position, resume

TENANT = "default"


def chunk(number: int) -> dict[str, Any]:
    content = {"type": "text", "text": f"chunk {number}\nwith a newline"}
    return {
        "type": EventType.UPDATE,
        "update": {"sessionUpdate": "agent_message_chunk", "content": content},
    }


async def make_session(session_log: SessionLog, events: int) -> tuple[str, list[LogEvent]]:
    session_id = new_session_id()
    await session_log.create(TENANT, session_id, {"type": EventType.CREATED, "cwd": "/tmp/a"})
    for number in range(events):
        await session_log.append(TENANT, session_id, chunk(number))
    return session_id, await session_log.read(TENANT, session_id)


def test_blob_round_trip_and_damage() -> None:
    entries = [(1, 10, '{"type":"created"}'), (2, 11, '{"a":"b c"}')]
    log = ArchivedLog("t", "s", "e1", 2, entries)
    assert decode(encode(log), "t", "s") == log
    blob = encode(log)
    for damaged in (blob[:-3], blob[:5] + b"x" + blob[6:], b""):
        with pytest.raises(ArchiveCorrupt):
            decode(damaged, "t", "s")
    with pytest.raises(ArchiveCorrupt, match="another session"):
        decode(blob, "t", "other")


async def test_archived_log_reads_and_appends_as_hot(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "RESTORE_CHUNK", 7)  # a restore in several parts
    archive = DirectoryArchive(tmp_path)
    session_log = SessionLog(store, archive=archive)
    session_id, before = await make_session(session_log, 30)
    keys = SessionKeys(TENANT, session_id)
    archiver = Archiver(store, archive, session_log=session_log)
    assert await archiver.archive_session(TENANT, session_id) == 31
    assert not await store.exists(keys.log)
    assert await store.hget(keys.snapshot, "archived") == "31"
    assert await archiver.archive_session(TENANT, session_id) == 0  # once only
    assert await session_log.read(TENANT, session_id) == before
    assert await session_log.read(TENANT, session_id, after=10, until=20) == before[10:20]
    assert await session_log.read(TENANT, session_id, after=5, count=3) == before[5:8]

    position_ = await session_log.append(TENANT, session_id, chunk(99))
    assert (position_.seq, position_.epoch) == (32, before[0].epoch)
    after = await session_log.read(TENANT, session_id)
    assert after[:31] == before and [e.seq for e in after] == list(range(1, 33))
    assert await store.hget(keys.snapshot, "archived") is None
    assert await store.xlen(keys.log) == 32


async def test_batch_appends_restore_each_archived_session(store: Any, tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path)
    session_log = SessionLog(store, archive=archive)
    archiver = Archiver(store, archive, session_log=session_log)
    one, _ = await make_session(session_log, 3)
    two, _ = await make_session(session_log, 4)
    for session_id in (one, two):
        assert await archiver.archive_session(TENANT, session_id)
    items = [(TENANT, one, chunk(1), ""), (TENANT, two, chunk(2), ""), (TENANT, one, chunk(3), "")]
    results = await session_log.append_many(items)
    assert [r.seq for r in results if isinstance(r, Position)] == [5, 6, 6], results
    assert [e.seq for e in await session_log.read(TENANT, one)] == list(range(1, 7))


async def test_racing_restores_add_each_event_once(store: Any, tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path)
    session_log = SessionLog(store, archive=archive)
    session_id, before = await make_session(session_log, 40)
    await Archiver(store, archive, session_log=session_log).archive_session(TENANT, session_id)
    others = [SessionLog(store, archive=archive) for _ in range(3)]
    await asyncio.gather(*(other.restore(TENANT, session_id) for other in others))
    assert await store.xlen(SessionKeys(TENANT, session_id).log) == 41
    assert await session_log.read(TENANT, session_id) == before


async def test_an_append_racing_the_archive_keeps_the_log(store: Any, tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path)
    session_log = SessionLog(store, archive=archive)
    session_id, _ = await make_session(session_log, 5)
    whole = await session_log.read_whole(TENANT, session_id)
    assert whole is not None
    await archive.put(TENANT, session_id, encode(whole))
    await session_log.append(TENANT, session_id, chunk(6))  # between the write and the trim
    assert await session_log.trim_archived(TENANT, session_id, whole.seq, whole.epoch) == -1
    assert [e.seq for e in await session_log.read(TENANT, session_id)] == list(range(1, 8))


async def test_an_unreadable_archive_is_a_clear_error(store: Any, tmp_path: Path) -> None:
    archive = DirectoryArchive(tmp_path)
    session_log = SessionLog(store, archive=archive)
    session_id, _ = await make_session(session_log, 5)
    await Archiver(store, archive, session_log=session_log).archive_session(TENANT, session_id)
    path = archive.path(TENANT, session_id)
    path.write_bytes(path.read_bytes()[:-10])
    fresh = SessionLog(store, archive=archive)  # nothing cached
    with pytest.raises(ArchiveCorrupt, match="unreadable"):
        await fresh.read(TENANT, session_id)
    with pytest.raises(ArchiveCorrupt):
        await fresh.append(TENANT, session_id, chunk(7))
    assert await store.hget(SessionKeys(TENANT, session_id).snapshot, "archived") == "6"
    path.unlink()
    with pytest.raises(ArchiveCorrupt, match="missing"):
        await SessionLog(store, archive=archive).read(TENANT, session_id)
    with pytest.raises(log_module.ArchiveUnavailable):
        await SessionLog(store).read(TENANT, session_id)


# -- end to end: v1 and v2 windows on an archived session ------------------------------------


async def archive_now(broker: Broker, session_id: str) -> None:
    """Archive the session once it is quiet: the agent host may still log a status, and a
    window's front its ``left`` presence (an archive the log moved on from is not kept)."""
    assert broker.archive is not None
    archiver = Archiver(broker.redis, broker.archive, session_log=broker.log)

    async def archived() -> bool:
        return await archiver.archive_session(broker.settings.tenant, session_id) > 0

    await wait_for(archived, 10.0, f"session {session_id} to stay quiet long enough to archive")


async def test_v1_and_v2_windows_on_an_archived_session(broker: Broker, url: str) -> None:
    client = await acp_client(url)
    session_id = await client.new(cwd="/tmp/project")
    await client.prompt(session_id, "/notool first prompt")
    await client.prompt(session_id, "/notool second prompt")

    hot_v1 = await acp_client(url)
    await hot_v1.conn.load_session(session_id=session_id, cwd="/tmp/project", mcp_servers=[])
    hot_v2 = await CheckedClient.open(url, 2)
    _, hot_replay = await resume(hot_v2, session_id, "/tmp/project", replayFrom={"type": "start"})
    middle = position(hot_replay[len(hot_replay) // 2])
    cursor = {"type": REPLAY_POSITION, **middle}
    _, hot_middle = await resume(hot_v2, session_id, "/tmp/project", replayFrom=cursor)
    assert hot_middle == [u for u in hot_replay if position(u)["seq"] >= middle["seq"]]
    await client.close()
    await hot_v1.close()
    await hot_v2.close()
    # The windows' presence (logged as they come and go) settles before the log is kept.
    await wait_for(lambda: all_left(broker, session_id), what="the windows' leaving logged")
    hot_log = await broker.log.read(TENANT, session_id)

    await archive_now(broker, session_id)
    assert not await commands(broker.redis).exists(SessionKeys(TENANT, session_id).log)
    assert await broker.log.read(TENANT, session_id) == hot_log

    loader = await acp_client(url)
    await loader.conn.load_session(session_id=session_id, cwd="/tmp/project", mcp_servers=[])
    assert loader.client.updates == hot_v1.client.updates
    reader = await CheckedClient.open(url, 2)
    _, replayed = await resume(reader, session_id, "/tmp/project", replayFrom={"type": "start"})
    assert replayed == hot_replay
    _, replayed = await resume(
        await CheckedClient.open(url, 2), session_id, "/tmp/project", replayFrom=cursor
    )
    assert replayed == hot_middle

    # A prompt brings the log back: the next seqs, the same epoch, nothing twice.
    reply = await reader.prompt(session_id, "/notool after the archive")
    assert "result" in reply, reply
    whole = await broker.log.read(TENANT, session_id)
    assert whole[: len(hot_log)] == hot_log
    assert [e.seq for e in whole] == list(range(1, len(whole) + 1))
    assert {e.epoch for e in whole} == {hot_log[0].epoch}
    assert await commands(broker.redis).exists(SessionKeys(TENANT, session_id).log)
    await loader.close()
    await reader.close()


# -- kill -9 of the archiving role at every step ---------------------------------------------


@pytest.mark.parametrize("step", ["read", "write", "confirm", "trim"])
async def test_kill_at_every_step_loses_and_doubles_nothing(
    redis_url: str, tmp_path: Path, step: str
) -> None:
    from broker.store.client import connect

    store = connect(redis_url)
    archive = DirectoryArchive(tmp_path)
    session_log = SessionLog(store, archive=archive)
    session_id, before = await make_session(session_log, 20)
    args = [
        "archive",
        "--older-than",
        "0",
        "--redis-url",
        redis_url,
        "--archive-store",
        str(tmp_path),
    ]

    async def archive_role(**env: str) -> int:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "broker.cli",
            *args,
            env={**subprocess_env(), **env},
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return await asyncio.wait_for(proc.wait(), 60)

    assert await archive_role(**{STOP_AT_ENV: step}) == -9
    fresh = SessionLog(store, archive=archive)
    assert await fresh.read(TENANT, session_id) == before  # nothing lost
    keys = SessionKeys(TENANT, session_id)
    archived = await commands(store).hget(keys.snapshot, "archived")
    assert archived is None  # every step is before the trim: the log is whole in Redis
    assert await commands(store).xlen(keys.log) == 21

    assert await archive_role() == 0  # the next round finishes the job
    assert await commands(store).hget(keys.snapshot, "archived") == "21"
    assert not await commands(store).exists(keys.log)
    assert await SessionLog(store, archive=archive).read(TENANT, session_id) == before
    await fresh.append(TENANT, session_id, chunk(21))
    assert [e.seq for e in await fresh.read(TENANT, session_id)] == list(range(1, 23))
    await store.aclose()


async def test_rebuild_reads_archived_logs_and_marks_old_sessions_hot(
    store: Any, tmp_path: Path
) -> None:
    from broker.store.keys import TenantKeys
    from broker.store.rebuild import rebuild_index

    archive = DirectoryArchive(tmp_path)
    session_log = SessionLog(store, archive=archive)
    archived, _ = await make_session(session_log, 3)
    old, _ = await make_session(session_log, 2)
    await Archiver(store, archive, session_log=session_log).archive_session(TENANT, archived)
    old_keys = SessionKeys(TENANT, old)
    await store.zrem(old_keys.hot, old_keys.member)  # logged before the archive existed
    assert (await rebuild_index(store, archive))[TENANT] == 2
    assert set(await store.hkeys(TenantKeys(TENANT).rows)) == {archived, old}
    assert await store.zscore(old_keys.hot, old_keys.member) is not None
    archived_keys = SessionKeys(TENANT, archived)
    assert await store.zscore(archived_keys.hot, archived_keys.member) is None
    assert not await store.exists(archived_keys.log)  # rebuilding restores nothing
