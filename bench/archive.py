"""Archive: what a session costs Redis once archived, measured as an operator would, and
what archiving and reading a log back cost.

**Redis bytes per archived session.** On a private redis-server (``noeviction``), a
projector role (archiving on: ``archive_after`` ``--archive-after`` seconds, a round and a
feed trim every second), an agent host role running the demo agent (a real subprocess;
no chunk delay) and a front node are started, ``--warmup`` sessions are made (as below) and
archived, so that what every deployment holds whatever its sessions (its connections'
buffers, scripts, the feeds' consumer groups) is counted once; then ``used_memory`` is
read (``before``).
N sessions are made through the front, as users make them: ``session/new`` over ACP in one
of 10 working folders with user metadata (``{"team": "team-<i mod 7>"}``: two words, each
in a catalog listing), then one ``session/prompt`` (``/chunks K``), so each session has a
title, metadata, an agent, a lease while its host holds it, and K + 6 events. Once every
session is archived (every partition's hot set empty) and the
change feeds and command streams are trimmed, ``used_memory`` is read again (``after``):
(after - before) / N is the figure, what ``INFO memory`` shows an operator (also read
after ``CONFIG RESETSTAT``, which frees Redis 7's per-command latency histograms, and
from the empty broker, warm-up included). Beside it,
``MEMORY USAGE`` of every key, summed by key kind (:mod:`bench.footprint`), before and
after, per session: the table of ``docs/redis-memory.md``.

**Archive throughput and load.** On the same server, S synthetic sessions of E events
each are logged (``append_many``, 16 events a call) and indexed, then archived one after
another by :class:`~workers.projector.archiving.Archiver`: events archived per second.
Then one L-event session's whole log is read (``SessionLog.read``, what ``session/load``
does before sending) hot, archived in the directory store and in PostgreSQL (a private
server, ``initdb``), with no cache; the median of R rounds each.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from typing import Any

from bench import common, footprint
from bench.acp import acp_client

TENANT = "default"
FOLDERS = 10


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


async def _used(redis: Any) -> int:
    """``used_memory``, once the connections' buffers have shrunk back: Redis frees an idle
    client's query buffer (20 KB, each connection that has just been busy) within a couple
    of seconds, which moved a reading by over a megabyte."""
    readings: list[int] = []
    for _ in range(30):  # until it held for 3 s (Redis looks at idle clients every 2 s)
        readings.append(int((await redis.memory_stats())["clients.normal"]))
        if len(readings) >= 4 and min(readings[-4:-1]) <= readings[-1]:
            break
        await asyncio.sleep(1.0)
    return int((await redis.info("memory"))["used_memory"])


async def _operators_reading(redis: Any) -> tuple[int, int]:
    """``used_memory`` read as an operator sizing Redis for N sessions reads it: the command
    statistics reset, and the clients' buffers set apart (``mem_clients_normal`` and
    ``mem_clients_slaves``: fixed costs, a few dozen connections' whatever the sessions);
    returns (that, the clients' buffers)."""
    await redis.config_resetstat()
    await _used(redis)  # once the buffers have shrunk back
    info = await redis.info("memory")
    clients = int(info.get("mem_clients_normal", 0)) + int(info.get("mem_clients_slaves", 0))
    return int(info["used_memory"]) - clients, clients


async def _used_without_stats(redis: Any) -> int:
    """``used_memory`` less the command statistics: ``CONFIG RESETSTAT`` first, which frees
    Redis 7's per-command latency histograms (about 1 MB once the broker has used its
    commands: a fixed cost, whatever the number of sessions)."""
    await redis.config_resetstat()
    return await _used(redis)


# -- sessions made through a front ------------------------------------------------------------


async def _make_sessions(url: str, count: int, chunks: int, concurrency: int) -> None:
    """``count`` sessions through the front at ``url``, each prompted once (``/chunks``:
    the demo agent streams that many chunks), over ``concurrency`` ACP connections."""
    todo = iter(range(count))

    async def worker() -> None:
        async with acp_client(url) as client:
            for i in todo:
                folder = f"/srv/bench/project-{i % FOLDERS}"
                meta = {"team": f"team-{i % 7}"}  # 2 words: team, 0 to 6
                params = {"cwd": folder, "mcpServers": [], "_meta": meta}
                result = await client.request("session/new", params, timeout=120)
                sid = str(result["sessionId"])
                prompt = [{"type": "text", "text": f"/chunks {chunks} fix the build of part {i}"}]
                await client.request(
                    "session/prompt", {"sessionId": sid, "prompt": prompt}, timeout=300
                )

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _settled(redis: Any, timeout: float) -> float:
    """Wait until every log is archived (every partition's hot set empty), no host holds a
    session (the leases set empty) and the change feeds and command streams are trimmed
    (empty: every entry consumed); the seconds waited."""
    from broker.store.keys import PARTITIONS, feed_key, host_queue, hot_key, leases_key

    started = time.monotonic()
    left: list[int] = []
    while time.monotonic() - started < timeout:
        async with redis.pipeline(transaction=False) as pipe:
            for p in range(PARTITIONS):
                pipe.zcard(hot_key(p))
            for p in range(PARTITIONS):
                pipe.xlen(feed_key(p))
            pipe.xlen(host_queue())
            pipe.zcard(leases_key())
            counts = await pipe.execute()
        inboxes = 0
        async for key in redis.scan_iter(match="acpb:host:*:inbox"):
            inboxes += await redis.xlen(key)
        left = [sum(counts[:PARTITIONS]), sum(counts[PARTITIONS:-2]), counts[-2] + inboxes]
        left.append(counts[-1])
        if not any(left):
            return time.monotonic() - started
        await asyncio.sleep(1.0)
    raise TimeoutError(
        f"not settled within {timeout:.0f} s: hot sessions, notices, commands, leases {left}"
    )


async def _through_front(url: str, folder: str, args: Any) -> dict[str, Any]:
    """Sessions made through a front, archived by the projector role: Redis before/after."""
    from broker.store.client import connect

    env = {
        **common.BENCH_ENV,
        "ACP_BROKER_ARCHIVE_STORE": folder,
        "ACP_BROKER_ARCHIVE_AFTER": str(args.archive_after),
        "ACP_BROKER_ARCHIVE_INTERVAL": "1",
        "ACP_BROKER_FEED_TRIM_INTERVAL": "1",
        "ACP_DEMO_CHUNK_DELAY": "0",
        "ACP_DEMO_TEST_COMMANDS": "1",
    }
    redis: Any = connect(url)  # an operator's view: INFO and MEMORY, beyond the Store protocol
    async with contextlib.AsyncExitStack() as stack:
        for role in ("projector", "agent-host"):
            log = common.LOGS / f"archive-{role}.log"
            await stack.enter_async_context(common.role_process(role, url, log, env=env))
        [front] = await stack.enter_async_context(common.fronts(url, 1, "archive", env=env))
        empty = await _used(redis)
        operator_empty, clients_empty = await _operators_reading(redis)
        # A few sessions first, archived too: the connections, scripts, feeds' groups and
        # listings' keys every deployment has are then in ``before``, not in the figure.
        await _make_sessions(front.url, args.warmup, args.chunks, args.concurrency)
        await _settled(redis, args.archive_after + 600)
        before = await _used(redis)
        bare_before = await _used_without_stats(redis)
        stats_before = await redis.memory_stats()
        kinds_before = await footprint.by_kind(redis)
        started = time.monotonic()
        await _make_sessions(front.url, args.sessions, args.chunks, args.concurrency)
        made_s = time.monotonic() - started
        waited = await _settled(redis, args.archive_after + 600)
        after = await _used(redis)
        bare_after = await _used_without_stats(redis)
        kinds_after = await footprint.by_kind(redis)
        operator_after, clients_after = await _operators_reading(redis)
        stats = await redis.memory_stats()
    await redis.aclose()
    return {
        "empty": empty,
        "operator_empty": operator_empty,
        "operator_after": operator_after,
        "clients_empty": clients_empty,
        "clients_after": clients_after,
        "marks_after": kinds_after.get(footprint.TAKEN_MARKS, (0, 0))[1],
        "before": before,
        "after": after,
        "per_session": (after - before) / args.sessions,
        "bare_before": bare_before,
        "bare_after": bare_after,
        "per_session_bare": (bare_after - bare_before) / args.sessions,
        "kinds": footprint.difference(kinds_after, kinds_before),
        "keys_after": int(stats.get("keys.count", 0)),
        "stats": footprint.stats_difference(stats, stats_before),
        "made_s": made_s,
        "settled_s": waited,
    }


async def _read_time(make_log: Any, sid: str, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        log = make_log()
        started = time.perf_counter()
        events = await log.read(TENANT, sid)
        times.append(time.perf_counter() - started)
        assert events and events[-1].seq == len(events)
    return common.median(times) * 1000


async def _throughput_and_load(url: str, folder: str, args: Any) -> dict[str, Any]:
    """Synthetic sessions archived one after another, then one long log read back."""
    from broker.store.archive import DirectoryArchive
    from broker.store.archive.postgres import PostgresArchive
    from broker.store.client import connect
    from broker.store.index import SessionIndex
    from broker.store.log import SessionLog
    from tests.support.postgres_server import postgres_available, postgres_server
    from workers.projector.archiving import Archiver

    rounds = 5 if args.quick else 20
    redis = connect(url)
    archive = DirectoryArchive(folder)
    log = SessionLog(redis, archive=archive)
    index = SessionIndex(redis)
    made = await _fill(log, index, args.throughput_sessions, args.events)
    archiver = Archiver(redis, archive, session_log=log)
    started = time.perf_counter()
    moved = 0
    for sid in made:
        moved += await archiver.archive_session(TENANT, sid)
    seconds = time.perf_counter() - started

    [sid] = await _fill(log, index, 1, args.load_events)
    hot_ms = await _read_time(lambda: SessionLog(redis, archive=archive), sid, rounds)
    await archiver.archive_session(TENANT, sid)
    dir_ms = await _read_time(lambda: SessionLog(redis, archive=archive), sid, rounds)
    pg_ms: float | None = None
    if postgres_available():
        with postgres_server() as dsn:
            pg = PostgresArchive(dsn)
            await log.restore(TENANT, sid)
            await Archiver(redis, pg, session_log=SessionLog(redis, archive=pg)).archive_session(
                TENANT, sid
            )
            pg_ms = await _read_time(lambda: SessionLog(redis, archive=pg), sid, rounds)
            await pg.close()
    index.close()
    await redis.aclose()
    return {
        "archive_events_per_s": moved / seconds,
        "load_hot_ms": hot_ms,
        "load_directory_ms": dir_ms,
        "load_postgres_ms": pg_ms,
    }


async def run(args: Any) -> None:
    args.sessions = args.sessions or (100 if args.quick else 1000)
    args.events = args.events or 1000
    args.load_events = args.load_events or (2000 if args.quick else 10_000)
    folder = tempfile.mkdtemp(prefix="acpb-bench-archive-")
    with common.private_redis("--maxmemory-policy", "noeviction") as url:
        front = await _through_front(url, folder, args)
        rest = (
            await _throughput_and_load(url, tempfile.mkdtemp(prefix="acpb-bench-archive-"), args)
            if args.throughput_sessions
            else {}
        )
    n = args.sessions
    marks = front["kinds"].get(footprint.TAKEN_MARKS, (0, 0))[1]
    made = n + args.warmup
    operators = (front["operator_after"] - front["operator_empty"] - front["marks_after"]) / made
    rows = [
        [
            "Redis bytes per archived session, the operator's way: from the empty broker, "
            "command statistics reset, clients' buffers and taken marks set apart",
            common.fmt(operators),
        ],
        [
            "fixed: used_memory of the empty broker, statistics reset, buffers set apart",
            common.fmt(front["operator_empty"]),
        ],
        [
            "fixed: the clients' buffers, empty broker / after",
            f"{common.fmt(front['clients_empty'])} / {common.fmt(front['clients_after'])}",
        ],
        ["used_memory, the broker started, no session yet", common.fmt(front["empty"])],
        [
            f"used_memory before ({args.warmup} sessions made and archived)",
            common.fmt(front["before"]),
        ],
        [f"used_memory after {n} more, archived, streams trimmed", common.fmt(front["after"])],
        [
            "Redis bytes per archived session, from the empty broker (used_memory)",
            common.fmt((front["after"] - front["empty"]) / (n + args.warmup)),
        ],
        ["Redis bytes per archived session (used_memory)", common.fmt(front["per_session"])],
        [
            "the same, command statistics reset before each reading",
            common.fmt(front["per_session_bare"]),
        ],
        [
            "the same, less the taken marks (they expire 10 min after their session's making)",
            common.fmt(front["per_session_bare"] - marks / n),
        ],
        ["keys left after", common.fmt(front["keys_after"])],
        ["seconds to make the sessions", f"{front['made_s']:.1f}"],
        ["seconds until archived and trimmed", f"{front['settled_s']:.1f}"],
    ]
    kinds = [
        [kind, common.fmt(count), common.fmt(size), f"{size / n:.1f}"]
        for kind, (count, size) in sorted(front["kinds"].items(), key=lambda kv: -kv[1][1])
    ]
    accounted = sum(size for _, size in front["kinds"].values())
    kinds.append(["(all keys)", "", common.fmt(accounted), f"{accounted / n:.1f}"])
    outside = front["bare_after"] - front["bare_before"] - accounted
    kinds.append(["(outside any key)", "", common.fmt(outside), f"{outside / n:.1f}"])
    if rest:
        rows += [
            ["archive throughput (events/s)", common.fmt(rest["archive_events_per_s"])],
            [f"read {args.load_events} events hot (ms)", f"{rest['load_hot_ms']:.1f}"],
            [
                f"read {args.load_events} events archived, directory (ms)",
                f"{rest['load_directory_ms']:.1f}",
            ],
            [
                f"read {args.load_events} events archived, PostgreSQL (ms)",
                f"{rest['load_postgres_ms']:.1f}"
                if rest["load_postgres_ms"] is not None
                else "no initdb",
            ],
        ]
    data = {
        "sessions": n,
        "chunks": args.chunks,
        "bytes_per_archived_session_operators_way": operators,
        "used_memory_empty_operators_way": front["operator_empty"],
        "clients_buffers_empty": front["clients_empty"],
        "clients_buffers_after": front["clients_after"],
        "used_memory_empty": front["empty"],
        "warmup_sessions": args.warmup,
        "used_memory_before": front["before"],
        "used_memory_after": front["after"],
        "bytes_per_archived_session": front["per_session"],
        "bytes_per_archived_session_stats_reset": front["per_session_bare"],
        "bytes_per_archived_session_marks_expired": front["per_session_bare"] - marks / n,
        "memory_stats_difference": front["stats"],
        "by_kind": {kind: {"keys": c, "bytes": s} for kind, (c, s) in front["kinds"].items()},
        "events": args.events,
        "load_events": args.load_events,
        **rest,
    }
    tables = [
        common.table("archive", ["figure", "value"], rows),
        common.table(
            f"Redis by key kind, after less before ({n} sessions)",
            ["kind", "keys", "bytes", "bytes/session"],
            kinds,
        ),
    ]
    common.report("archive", tables, data, args.out)


def main(argv: list[str]) -> None:
    p = common.parser("archive", __doc__ or "")
    p.add_argument("--sessions", type=int, default=None, help="sessions made (default 1000)")
    p.add_argument("--chunks", type=int, default=96, help="chunks of each session's prompt")
    p.add_argument(
        "--warmup", type=int, default=50, help="sessions made and archived before 'before'"
    )
    p.add_argument("--concurrency", type=int, default=16, help="ACP connections making them")
    p.add_argument("--archive-after", type=float, default=5.0, help="the projector's setting")
    p.add_argument(
        "--throughput-sessions",
        type=int,
        default=100,
        help="synthetic sessions archived for the throughput figure (0: skip it and the load)",
    )
    p.add_argument("--events", type=int, default=None, help="events per synthetic session")
    p.add_argument("--load-events", type=int, default=None, help="events of the loaded session")
    asyncio.run(run(p.parse_args(argv)))
