"""Archive: what a session costs Redis hot and archived, and what reading it back costs.

On a private redis-server (``noeviction``), N sessions of E events each are logged
(``append_many``, 16 events a call, as agent hosts log) and indexed (the projector's
``SessionIndex.project``), then archived to the directory store by the archiving role's
:class:`~workers.projector.archiving.Archiver`:

* **Redis bytes per session**: ``MEMORY USAGE`` of a session's keys (log, snapshot,
  metadata) plus its share of the partitions' hot and deleted sets and of the tenant's
  index keys, hot and after archiving (what stays: snapshot, metadata, index rows); and
  ``used_memory`` of the whole server with archiving off (all hot) and on (all archived),
  which also holds the partitions' change feeds (capped by ``feed_maxlen``, not by
  archiving).
* **archive throughput**: events archived per second (read from Redis, compress, write,
  fsync, read back, trim), one session after another.
* **load**: reading one L-event session's whole log (``SessionLog.read``, what
  ``session/load`` and a replay from the start do before sending), hot from Redis, then
  archived in the directory store and in PostgreSQL (a private server, ``initdb``), with
  no cache (a fresh reader per round); the median of R rounds each.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from typing import Any

from bench import common

TENANT = "default"


def _event(i: int) -> dict[str, Any]:
    text = f"an agent message chunk of a realistic length, number {i}"
    content = {"type": "text", "text": text}
    return {
        "type": "update",
        "update": {"sessionUpdate": "agent_message_chunk", "content": content},
    }


async def _fill(log: Any, index: Any, sessions: int, events: int) -> list[str]:
    from broker.store.log import new_session_id

    made = []
    for _ in range(sessions):
        sid = new_session_id()
        await log.create(TENANT, sid, {"type": "created", "cwd": "/srv/bench"})
        for start in range(0, events - 1, 16):
            count = min(16, events - 1 - start)
            await log.append_many([(TENANT, sid, _event(start + i), "") for i in range(count)])
        await index.project(await log.snapshot(TENANT, sid))
        made.append(sid)
    return made


async def _session_bytes(redis: Any, sids: list[str]) -> float:
    """Mean Redis bytes of a session (``MEMORY USAGE``): its own keys, plus its share of the
    partition sets and of its tenant's index keys."""
    from broker.store.keys import PARTITIONS, SessionKeys, TenantKeys, deleted_key, hot_key

    own = 0
    for sid in sids:
        keys = SessionKeys(TENANT, sid)
        for key in (keys.log, keys.snapshot, keys.meta):
            own += await redis.memory_usage(key, samples=0) or 0
    shared = 0
    tenant = TenantKeys(TENANT)
    names = [tenant.rows, tenant.versions]
    names += [key async for key in redis.scan_iter(match=tenant.index("*"))]
    names += [hot_key(p) for p in range(PARTITIONS)] + [deleted_key(p) for p in range(PARTITIONS)]
    for key in names:
        shared += await redis.memory_usage(key, samples=0) or 0
    return (own + shared) / len(sids)


async def _used(redis: Any) -> int:
    return int((await redis.info("memory"))["used_memory"])


async def _trimmed(redis: Any) -> int:
    """``used_memory`` once the feeds are trimmed as a projector's trimming loop does.

    The bench projected every session itself, so the projectors' group is made at the
    feeds' ends: every notice delivered and acknowledged."""
    from broker.store.keys import PARTITIONS, feed_key
    from workers.projector.feeds import trim_feeds
    from workers.projector.worker import GROUP

    for partition in range(PARTITIONS):
        await redis.xgroup_create(feed_key(partition), GROUP, id="$", mkstream=True)
    await trim_feeds(redis)
    return await _used(redis)


async def _read_time(make_log: Any, sid: str, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        log = make_log()
        started = time.perf_counter()
        events = await log.read(TENANT, sid)
        times.append(time.perf_counter() - started)
        assert events and events[-1].seq == len(events)
    return common.median(times) * 1000


async def run(args: Any) -> None:
    from broker.store.archive import DirectoryArchive
    from broker.store.archive.postgres import PostgresArchive
    from broker.store.client import connect
    from broker.store.index import SessionIndex
    from broker.store.log import SessionLog
    from tests.support.postgres_server import postgres_available, postgres_server
    from workers.projector.archiving import Archiver

    sessions = args.sessions or (100 if args.quick else 1000)
    events = args.events or 1000
    long = args.load_events or (2000 if args.quick else 10_000)
    rounds = 5 if args.quick else 20
    folder = tempfile.mkdtemp(prefix="acpb-bench-archive-")
    with common.private_redis("--maxmemory-policy", "noeviction") as url:
        redis = connect(url)
        archive = DirectoryArchive(folder)
        log = SessionLog(redis, archive=archive)
        index = SessionIndex(redis)
        made = await _fill(log, index, sessions, events)
        hot = await _used(redis)
        per_hot = await _session_bytes(redis, made)
        archiver = Archiver(redis, archive, session_log=log)
        started = time.perf_counter()
        moved = 0
        for sid in made:
            moved += await archiver.archive_session(TENANT, sid)
        seconds = time.perf_counter() - started
        cold = await _used(redis)
        per_cold = await _session_bytes(redis, made)
        trimmed = await _trimmed(redis)

        [sid] = await _fill(log, index, 1, long)
        hot_ms = await _read_time(lambda: SessionLog(redis, archive=archive), sid, rounds)
        await archiver.archive_session(TENANT, sid)
        dir_ms = await _read_time(lambda: SessionLog(redis, archive=archive), sid, rounds)
        pg_ms: float | None = None
        if postgres_available():
            with postgres_server() as dsn:
                pg = PostgresArchive(dsn)
                await log.restore(TENANT, sid)
                await Archiver(
                    redis, pg, session_log=SessionLog(redis, archive=pg)
                ).archive_session(TENANT, sid)
                pg_ms = await _read_time(lambda: SessionLog(redis, archive=pg), sid, rounds)
                await pg.close()
        index.close()
        await redis.aclose()

    rows = [
        ["Redis bytes per hot session", common.fmt(per_hot)],
        ["Redis bytes per archived session", common.fmt(per_cold)],
        [f"used_memory, {sessions} x {events} events, archiving off", common.fmt(hot)],
        [f"used_memory, {sessions} x {events} events, archived", common.fmt(cold)],
        ["used_memory, archived, feeds trimmed behind the group", common.fmt(trimmed)],
        ["archive throughput (events/s)", common.fmt(moved / seconds)],
        [f"read {long} events hot (ms)", f"{hot_ms:.1f}"],
        [f"read {long} events archived, directory (ms)", f"{dir_ms:.1f}"],
        [
            f"read {long} events archived, PostgreSQL (ms)",
            f"{pg_ms:.1f}" if pg_ms is not None else "no initdb",
        ],
    ]
    data = {
        "sessions": sessions,
        "events": events,
        "bytes_per_hot_session": per_hot,
        "bytes_per_archived_session": per_cold,
        "used_memory_archiving_off": hot,
        "used_memory_archived": cold,
        "used_memory_feeds_trimmed": trimmed,
        "archive_events_per_s": moved / seconds,
        "load_events": long,
        "load_hot_ms": hot_ms,
        "load_directory_ms": dir_ms,
        "load_postgres_ms": pg_ms,
    }
    common.report("archive", [common.table("archive", ["figure", "value"], rows)], data, args.out)


def main(argv: list[str]) -> None:
    p = common.parser("archive", __doc__ or "")
    p.add_argument("--sessions", type=int, default=None, help="sessions (default 1000)")
    p.add_argument("--events", type=int, default=None, help="events per session (default 1000)")
    p.add_argument("--load-events", type=int, default=None, help="events of the loaded session")
    asyncio.run(run(p.parse_args(argv)))
