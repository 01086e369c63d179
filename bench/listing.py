"""session/list at 1,000,000 sessions in one tenant: a page at the start, middle and end.

* **broker**: ``session/list`` over a WebSocket to a front node (``serve --no-workers``)
  with its list page cache (the default): every cell asks the same page of an unchanged
  index again and again (what windows polling the first page ask), so after the first
  answer it is served from the front's memory,
  from the lean client (:mod:`bench.wsclient`) the other benchmarks use,
  with a signed cursor at each depth, with and without a ``cwd`` filter (10 cwds, so the
  filtered listing holds 100,000 sessions). The index is written straight into Redis in the
  projector's format (rows hash + lex-ordered listings), pipelined, which is what the
  projector would leave after projecting these sessions.
  Besides the three depths, a **walk** cell: each ask is for the page after the one the ask
  before it read, from the first page on (a client paging through the list). There a page
  is asked for the first time, so a front answers it from memory only if it read it ahead
  (the page cache's read ahead: the other systems' asks of the turn come between two of
  its asks, as a client's own work would).
* **uncached**: the same requests to a second front with ``list_cache = false``: every page
  read from Redis, what a page nobody asked for since the index last changed costs.
* **floor**: the raw Redis read that one page needs (``ZRANGE … BYLEX LIMIT``; the ACP
  listings' members carry each session's ``SessionInfo`` text), from a redis-py client.
* **index read**: the broker's own store read of a page as ``session/list`` makes it
  (``SessionIndex.page``: that ``ZRANGE``, its ``SessionInfo`` texts joined, ready to
  splice) from a client process: the like of the PostgreSQL query below.
* **pg query**: PostgreSQL, a table with an index over (tenant, updated_at desc, id) (and
  one with cwd), a keyset query per page through asyncpg, fetching each row's
  ``SessionInfo`` JSON text (a PostgreSQL-backed broker would splice it as this one does).
* **pg server** (the peer as a system): the same query behind a WebSocket
  (:mod:`bench.peers.pg_server`): ``session/list`` with the same cursors, from the same lean
  client. It crosses the two hops a ``session/list`` crosses (client → server → store),
  where the floor, the index read and the pg query cross one.
* **redis relay** (``redis_ws``): the two-hop ceiling, a bare WebSocket server in front of
  the same Redis (:mod:`bench.peers.redis_server`, its own process, on the fronts' event
  loop): ``session/list`` with the same cursors, each answered by the one ``ZRANGE … BYLEX
  LIMIT`` a front makes (hiredis), the members' ``SessionInfo`` texts spliced as a front
  splices them, from the same lean client. Taken as websockets parses the frame, the read
  sent from that step and the reply framed and written from the step that parses Redis's
  answer: no task, timer or future, none of the broker's authentication, metrics, checks or
  cache. What two hops cost at the least with the libraries a front uses: the uncached
  front against it is what the front's own code adds; it against the floor, what the second
  hop does. On the 2-core VM (2026-12-02, 6 runs at 1,000,000 sessions, medians per cell)
  its p99 was 1.21-1.39 times the floor's (34 of the 36 single cells within 1.5), the
  uncached front's 1.32-1.50 times its own: two hops can come within 1.5 of one here, and
  what is left above that is the front's own Python (``perf``: its interpreter's samples
  per request about twice the relay's, the kernel's alike).

The PostgreSQL server is the benchmark's own (``initdb`` in a temporary folder, over loopback
TCP; ``BENCH_PG_DSN`` names another); its systems are skipped (reported as such) when it
cannot be had.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from bench import common
from bench.acp import lean_acp_client

SYSTEMS = ("broker", "uncached", "redis_ws", "floor", "index", "postgres", "pg_ws")
TENANT = "default"
PAGE = 50
CWDS = 10
BASE_MS = 1_780_000_000_000
UNCACHED = {"ACP_BROKER_LIST_CACHE": "false"}
"""The environment of the uncached fronts: every page read from Redis."""
PG_DSN = os.environ.get("BENCH_PG_DSN")
"""A PostgreSQL server to use; unset (the default), the benchmark starts its own (``initdb``
in a temporary folder, reached over loopback TCP as the Redis servers are)."""


def sid(i: int) -> str:
    return f"sess_{i:032x}"


def updated_ms(i: int) -> int:
    return BASE_MS - (i // 2) * 1000  # pairs share a timestamp: ties broken by id


def cwd_of(i: int) -> str:
    return f"/srv/project{i % CWDS}"


def row_json(i: int) -> str:
    from broker.store.index import rfc3339

    return json.dumps(
        {
            "sessionId": sid(i),
            "cwd": cwd_of(i),
            "additionalDirectories": [],
            "title": f"Session number {i}",
            "updatedAt": rfc3339(updated_ms(i)),
            "createdAt": rfc3339(updated_ms(i) - 60_000),
            "status": "RUNNING",
            "kind": "combined",
            "agent": "demo",
            "_meta": {},
        },
        separators=(",", ":"),
    )


def session_info(i: int) -> str:
    """Session ``i`` as ``session/list`` shows it (what the broker splices from its rows)."""
    from broker.store.index import encode_row

    return encode_row(json.loads(row_json(i))).partition("\n")[0]


async def populate_redis(url: str, n: int) -> None:
    from broker.store.client import commands, connect
    from broker.store.index import ACP_LISTING, cwd_listing, encode_row, member, stored_member
    from broker.store.keys import TenantKeys

    keys = TenantKeys(TENANT)
    store = commands(connect(url))
    batch = 20_000
    for start in range(0, n, batch):
        rows, acp = {}, {}
        by_cwd: dict[str, dict[str, int]] = {}
        for i in range(start, min(n, start + batch)):
            rows[sid(i)] = row = encode_row(json.loads(row_json(i)))
            at, info = member(updated_ms(i), sid(i)), row.partition("\n")[0]
            acp[stored_member(ACP_LISTING, at, info)] = 0
            listing = cwd_listing(cwd_of(i))
            by_cwd.setdefault(listing, {})[stored_member(listing, at, info)] = 0
        async with store.pipeline(transaction=False) as pipe:
            pipe.hset(keys.rows, mapping=rows)
            pipe.zadd(keys.index(ACP_LISTING), acp)
            for listing, members in by_cwd.items():
                pipe.zadd(keys.index(listing), members)
            await pipe.execute()
    await store.aclose()


def depths(n: int) -> dict[str, int | None]:
    """Rank of the row each page starts after (None: the first page); last page: PAGE rows."""
    return {"start": None, "middle": n // 2 - 1, "end": n - PAGE - 1}


def position_rank(rank: int | None, cwd: int | None) -> int | None:
    """The session index i of the row at ``rank`` of the listing (all, or one cwd's)."""
    if rank is None:
        return None
    return rank if cwd is None else rank * CWDS + cwd


def broker_position(i: int) -> str:
    """The keyset position the broker's cursors carry for session ``i`` (an index member)."""
    from broker.store.index import member

    return member(updated_ms(i), sid(i))


def pg_position(i: int) -> str:
    """The keyset position :mod:`bench.peers.pg_server`'s cursors carry."""
    return f"{updated_ms(i)}:{sid(i)}"


async def list_calls(
    client: Any, n: int, position: Callable[[int], str] = broker_position
) -> dict[str, Any]:
    """``session/list`` over a WebSocket, a page at each depth, checked once."""
    from broker.store.cursors import CursorCodec, fingerprint

    codec = CursorCodec([common.CURSOR_SECRET.encode()])
    out: dict[str, Any] = {}
    for filtered in (False, True):
        cwd = 3 if filtered else None
        count = n // CWDS if filtered else n
        filters = {"cwd": cwd_of(cwd)} if cwd is not None else {}
        mark = fingerprint(TENANT, "acp", filters)
        for depth, rank in depths(count).items():
            params: dict[str, Any] = dict(filters)
            i = position_rank(rank, cwd)
            if i is not None:
                params["cursor"] = codec.encode(position(i), mark)
            result = await client.request("session/list", params)
            expected_first = position_rank(0 if rank is None else rank + 1, cwd)
            assert result["sessions"][0]["sessionId"] == sid(expected_first or 0), result
            assert len(result["sessions"]) == PAGE, len(result["sessions"])
            assert ("nextCursor" in result) == (depth != "end")

            async def call(params: dict[str, Any] = params) -> None:
                await client.request("session/list", params)

            out[f"{'cwd' if filtered else 'all'}/{depth}"] = call
        out[f"{'cwd' if filtered else 'all'}/walk"] = _walk(client, filters)
    return out


def _walk(client: Any, filters: dict[str, Any]) -> Callable[[], Any]:
    """A ``walk`` cell's call: the page after the one the call before it read (from the
    first page, and again from it after the last): a client paging through the list."""
    params = dict(filters)

    async def call() -> None:
        nonlocal params
        result = await client.request("session/list", params)
        assert len(result["sessions"]) == PAGE, len(result["sessions"])
        cursor = result.get("nextCursor")
        params = {**filters, "cursor": cursor} if cursor else dict(filters)

    return call


async def floor_calls(store: Any, n: int) -> dict[str, Any]:
    """The one Redis read a page needs (its listing's members carry the ``SessionInfo``
    texts), from a redis-py client: no cursor, no splitting, no joining."""
    from broker.store.index import ACP_LISTING, cwd_listing, lower_bound, member
    from broker.store.keys import TenantKeys

    keys = TenantKeys(TENANT)
    out: dict[str, Any] = {}
    for filtered in (False, True):
        cwd = 3 if filtered else None
        count = n // CWDS if filtered else n
        listing = keys.index(cwd_listing(cwd_of(cwd)) if cwd is not None else ACP_LISTING)
        for depth, rank in depths(count).items():
            i = position_rank(rank, cwd)
            low = lower_bound(None if i is None else member(updated_ms(i), sid(i)))

            async def call(low: str = low, listing: str = listing) -> None:
                members = await store.zrange(listing, low, "+", bylex=True, offset=0, num=PAGE + 1)
                assert len(members) >= PAGE

            await call()
            out[f"{'cwd' if filtered else 'all'}/{depth}"] = call
        out[f"{'cwd' if filtered else 'all'}/walk"] = _floor_walk(store, listing)
    return out


def _floor_walk(store: Any, listing: str) -> Callable[[], Any]:
    """:func:`_walk` as the floor reads it: each ``ZRANGE`` after the last member the one
    before it read (its position: up to the ``SessionInfo``'s mark)."""
    from broker.store.index import lower_bound

    low = lower_bound(None)

    async def call() -> None:
        nonlocal low
        members = await store.zrange(listing, low, "+", bylex=True, offset=0, num=PAGE + 1)
        assert len(members) >= PAGE
        more = len(members) > PAGE
        low = lower_bound(members[PAGE - 1].partition("\x01")[0] if more else None)

    return call


async def index_calls(store: Any, n: int) -> dict[str, Any]:
    """The broker's own index read as session/list makes it (one ZRANGE, its SessionInfo
    texts joined), in-process: the like of the PostgreSQL query, without the WebSocket
    hop."""
    from broker.store.index import ACP_LISTING, SessionIndex, cwd_listing, member

    index = SessionIndex(store)
    out: dict[str, Any] = {}
    for filtered in (False, True):
        cwd = 3 if filtered else None
        count = n // CWDS if filtered else n
        listing = cwd_listing(cwd_of(cwd)) if cwd is not None else ACP_LISTING
        for depth, rank in depths(count).items():
            i = position_rank(rank, cwd)
            after = None if i is None else member(updated_ms(i), sid(i))

            async def call(listing: str = listing, after: str | None = after) -> None:
                page = await index.page(TENANT, listing, after, PAGE)
                assert page.infos.count(b'"sessionId"') == PAGE

            await call()
            out[f"{'cwd' if filtered else 'all'}/{depth}"] = call
    return out


async def postgres_calls(conn: Any, table: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if True:
        await conn.execute(
            f"CREATE TABLE {table} (tenant text NOT NULL, id text NOT NULL,"
            " updated_at bigint NOT NULL, cwd text NOT NULL, row text NOT NULL)"
        )
        batch = 50_000
        for start in range(0, n, batch):
            records = [
                (TENANT, sid(i), updated_ms(i), cwd_of(i), session_info(i))
                for i in range(start, min(n, start + batch))
            ]
            await conn.copy_records_to_table(table, records=records)
        await conn.execute(f"CREATE INDEX ON {table} (tenant, updated_at DESC, id)")
        await conn.execute(f"CREATE INDEX ON {table} (tenant, cwd, updated_at DESC, id)")
        await conn.execute(f"ANALYZE {table}")
        first_all = await conn.prepare(
            f"SELECT id, updated_at, row FROM {table} WHERE tenant = $1"
            " ORDER BY updated_at DESC, id LIMIT $2"
        )
        after_all = await conn.prepare(
            f"SELECT id, updated_at, row FROM {table} WHERE tenant = $1 AND updated_at <= $2"
            " AND (updated_at < $2 OR id > $3) ORDER BY updated_at DESC, id LIMIT $4"
        )
        first_cwd = await conn.prepare(
            f"SELECT id, updated_at, row FROM {table} WHERE tenant = $1 AND cwd = $2"
            " ORDER BY updated_at DESC, id LIMIT $3"
        )
        after_cwd = await conn.prepare(
            f"SELECT id, updated_at, row FROM {table} WHERE tenant = $1 AND cwd = $2"
            " AND updated_at <= $3 AND (updated_at < $3 OR id > $4)"
            " ORDER BY updated_at DESC, id LIMIT $5"
        )
        for filtered in (False, True):
            cwd = 3 if filtered else None
            count = n // CWDS if filtered else n
            for depth, rank in depths(count).items():
                i = position_rank(rank, cwd)
                if cwd is None:
                    args: tuple[Any, ...] = (
                        (TENANT, PAGE + 1)
                        if i is None
                        else (TENANT, updated_ms(i), sid(i), PAGE + 1)
                    )
                    stmt = first_all if i is None else after_all
                else:
                    args = (
                        (TENANT, cwd_of(cwd), PAGE + 1)
                        if i is None
                        else (TENANT, cwd_of(cwd), updated_ms(i), sid(i), PAGE + 1)
                    )
                    stmt = first_cwd if i is None else after_cwd
                first = 0 if rank is None else rank + 1
                rows = await stmt.fetch(*args)
                assert rows[0]["id"] == sid(position_rank(first, cwd) or 0), rows[0]["id"]

                async def call(stmt: Any = stmt, args: tuple[Any, ...] = args) -> None:
                    fetched = await stmt.fetch(*args)
                    assert len([r["row"] for r in fetched]) > PAGE // 2

                out[f"{'cwd' if filtered else 'all'}/{depth}"] = call
        plan = await conn.fetch(
            f"EXPLAIN SELECT id, updated_at, row FROM {table} WHERE tenant = $1"
            " AND updated_at <= $2 AND (updated_at < $2 OR id > $3)"
            " ORDER BY updated_at DESC, id LIMIT $4",
            TENANT,
            BASE_MS,
            sid(0),
            PAGE + 1,
        )
        print("  postgres plan: " + " / ".join(r[0].strip() for r in plan), flush=True)
    return out


def _counted(call: Any, served: list[int]) -> Any:
    async def counted() -> None:
        served[0] += 1
        await call()

    return counted


async def interleaved(
    systems: dict[str, dict[str, Any]],
    samples: int,
    seconds: float,
    churn: Callable[[], Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Time every system's call for each cell in turn, so the machine's noise hits all alike;
    ``churn`` (awaited before each turn, untimed): the tenant's index changes."""
    out: dict[str, dict[str, Any]] = {name: {} for name in systems}
    cells = list(next(iter(systems.values())))
    for cell in cells:
        calls = [(name, calls[cell]) for name, calls in systems.items() if cell in calls]
        for _ in range(min(20, samples)):  # warm-up
            for _, call in calls:
                await call()
        lat: dict[str, list[float]] = {name: [] for name, _ in calls}
        deadline = time.monotonic() + seconds
        k = 0
        while k < samples and time.monotonic() < deadline:
            if churn is not None:
                await churn()
            for name, call in calls[k % len(calls) :] + calls[: k % len(calls)]:
                t = time.perf_counter()
                await call()
                lat[name].append((time.perf_counter() - t) * 1000)
            k += 1
        for name, values in lat.items():
            out[name][cell] = common.latency_summary(values)
    return out


@contextlib.asynccontextmanager
async def postgres_table() -> AsyncIterator[tuple[Any, str, str] | str]:
    """A connection, a fresh uniquely named table (dropped afterwards) and the server's DSN:
    :data:`PG_DSN`'s, or a server of the benchmark's own; or why there is none."""
    import asyncpg

    from tests.support.postgres_server import postgres_available, postgres_server

    with contextlib.ExitStack() as servers:
        dsn = PG_DSN
        if dsn is None:
            if not postgres_available():
                yield "no initdb on this machine (or set BENCH_PG_DSN)"
                return
            dsn = servers.enter_context(postgres_server(tcp=True))
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except Exception as exc:  # no swallow: printed below the table, pg systems skipped
            yield repr(exc)[:200]
            return
        table = f"acpb_bench_list_{os.getpid()}_{int(time.time())}"
        try:
            yield conn, table, dsn
        finally:
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
            await conn.close()


@contextlib.asynccontextmanager
async def pg_server(dsn: str, table: str, tag: str) -> AsyncIterator[tuple[Any, int]]:
    """:mod:`bench.peers.pg_server` on ``table``: a lean client connected to it, and its pid."""
    args = (dsn, table, common.CURSOR_SECRET)
    async with common.child("bench.peers.pg_server", *args, name=f"{tag}-pg") as node:
        port = await node.expect("ready")
        async with lean_acp_client(f"ws://127.0.0.1:{port}/") as client:
            yield client, node.pid


@contextlib.asynccontextmanager
async def redis_relay(url: str, tag: str) -> AsyncIterator[tuple[Any, int]]:
    """:mod:`bench.peers.redis_server` on the index at ``url``: a lean client connected to
    it, and its pid."""
    args = (url, common.CURSOR_SECRET)
    async with common.child("bench.peers.redis_server", *args, name=f"{tag}-redis-ws") as node:
        port = await node.expect("ready")
        async with lean_acp_client(f"ws://127.0.0.1:{port}/") as client:
            yield client, node.pid


async def _one_run(
    args: Any,
    r: int,
    url: str,
    store: Any,
    pg: Any,
    pg_calls: dict[str, Any] | None,
    n: int,
    samples: int,
    seconds: float,
) -> dict[str, Any]:
    """One run over the index and table built before: fresh servers and clients, every
    system timed in turn; with ``_cpu``: each server's CPU µs per session/list."""
    async with (
        common.fronts(url, 1, f"list-{r}") as nodes,
        common.fronts(url, 1, f"list-{r}-uncached", env=UNCACHED) as bare,
        lean_acp_client(nodes[0].url) as client,
        lean_acp_client(bare[0].url) as bare_client,
        contextlib.AsyncExitStack() as stack,
    ):
        pids = {"broker": nodes[0].pid, "uncached": bare[0].pid}
        systems = {
            "broker": await list_calls(client, n),
            "uncached": await list_calls(bare_client, n),
            "floor": await floor_calls(store, n),
            "index": await index_calls(store, n),
        }
        if "redis_ws" in args.systems:
            relay, pids["redis_ws"] = await stack.enter_async_context(redis_relay(url, f"list-{r}"))
            systems["redis_ws"] = await list_calls(relay, n)
        if pg_calls is not None:
            systems["postgres"] = pg_calls
            _, table, dsn = pg
            peer_server = pg_server(dsn, table, f"list-{r}")
            peer, pids["pg_ws"] = await stack.enter_async_context(peer_server)
            systems["pg_ws"] = await list_calls(peer, n, pg_position)
        for rev in args.baseline:
            tree = common.baseline_tree(rev)
            for name, env in (("broker", None), ("uncached", UNCACHED)):
                pairs = await stack.enter_async_context(
                    common.fronts_at(tree, url, 1, f"list-{r}-{name}-{rev}", env=env)
                )
                old = await stack.enter_async_context(lean_acp_client(pairs[0][0]))
                systems[f"{name}@{rev}"] = await list_calls(old, n)
        chosen = {
            k: v for k, v in systems.items() if k in args.systems or k == "broker" or "@" in k
        }
        # session/list requests each server answered (warm-ups too)
        served = {name: [0] for name in pids if name in chosen}
        for name, count in served.items():
            chosen[name] = {cell: _counted(call, count) for cell, call in chosen[name].items()}
        async with contextlib.AsyncExitStack() as profiling:
            if args.profile:
                from bench.profile import recording

                for name in ("broker", "uncached", "redis_ws"):
                    pid = pids.get(name)
                    if pid is None or name not in chosen:
                        continue
                    out = common.RESULTS / f"profile-list-{name}.txt"
                    await profiling.enter_async_context(recording(pid, out, gil=True))
            cpu = {name: common.cpu_seconds(pids[name]) for name in served}
            churn = _churn(store, args.announce_gap / 1000) if args.announce_gap else None
            got: dict[str, Any] = await interleaved(chosen, samples, seconds, churn)
            got["_cpu"] = {
                name: common.ratio((common.cpu_seconds(pids[name]) - cpu[name]) * 1e6, count[0])
                for name, count in served.items()
            }
        got["_cache"] = await asyncio.to_thread(page_cache_outcomes, nodes[0].port)
    return got


def _churn(store: Any, gap: float) -> Callable[[], Any]:
    """An announcement that the tenant's index changed (what the projector publishes after
    each batch that wrote it), then ``gap`` seconds before the next turn's asks: a window
    polling a page some time after each change of its tenant."""
    from broker.store.keys import INDEX_CHANNEL

    async def churn() -> None:
        await store.spublish(INDEX_CHANNEL, TENANT)
        await asyncio.sleep(gap)

    return churn


def page_cache_outcomes(port: int) -> dict[str, float]:
    """The cached front's ``acp_broker_page_cache_total`` by outcome (its ``/metrics``): that
    the cached path was served from memory, not taken on trust."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("acp_broker_page_cache_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


async def run(args: Any) -> None:
    n = args.sessions or (5_000 if args.quick else 1_000_000)
    # A p99 of 3,000 samples rests on its 30 slowest; of 1,000 (as before), on 10, and two
    # runs of the same tree differed by a tenth.
    samples = args.samples or (20 if args.quick else 3000)
    seconds = 1.0 if args.quick else 60.0
    runs: list[dict[str, Any]] = []
    # CPU time per session/list of each server process (µs, one figure per run), over the
    # same window: the front node, and the PostgreSQL peer's server.
    server_cpu: dict[str, list[float]] = {
        "broker": [],
        "uncached": [],
        "redis_ws": [],
        "pg_ws": [],
    }
    unavailable = ""
    cache_outcomes: list[dict[str, float]] = []
    import redis.asyncio as redis

    # The index and the table are built once and read by every run (at 1,000,000 sessions
    # building them takes minutes); each run starts its servers and clients afresh.
    with common.private_redis() as url:
        print(f"list: {n:,} sessions", flush=True)
        t = time.monotonic()
        await populate_redis(url, n)
        print(f"  index written in {time.monotonic() - t:.1f}s", flush=True)
        store = redis.Redis.from_url(url, decode_responses=True)
        async with postgres_table() as pg:
            pg_calls: dict[str, Any] | None = None
            if isinstance(pg, str):
                unavailable = pg
            else:
                t = time.monotonic()
                pg_calls = await postgres_calls(pg[0], pg[1], n)
                print(f"  postgres table loaded in {time.monotonic() - t:.1f}s", flush=True)
            for r in range(args.runs):
                print(f"  run {r + 1}/{args.runs}", flush=True)
                got = await _one_run(args, r, url, store, pg, pg_calls, n, samples, seconds)
                cache = got.pop("_cache")
                print(f"  cached front's page cache: {cache}", flush=True)
                cache_outcomes.append(cache)
                for name, used in got.pop("_cpu").items():
                    server_cpu[name].append(used)
                for system in SYSTEMS:
                    got.setdefault(system, {})
                runs.append(got)
        await store.aclose()
    cells = [k for k in runs[0]["broker"]]
    rows = []
    summary: dict[str, Any] = {}
    for cell in cells:

        def med(system: str, stat: str, cell: str = cell) -> float:
            return common.median(
                [r[system][cell][stat] for r in runs if cell in r[system]] or [float("nan")]
            )

        b50, b99 = med("broker", "p50"), med("broker", "p99")
        u50, u99 = med("uncached", "p50"), med("uncached", "p99")
        f50, f99 = med("floor", "p50"), med("floor", "p99")
        p50, p99 = med("postgres", "p50"), med("postgres", "p99")
        w50, w99 = med("pg_ws", "p50"), med("pg_ws", "p99")
        r50, r99 = med("redis_ws", "p50"), med("redis_ws", "p99")
        i50, i99 = med("index", "p50"), med("index", "p99")
        summary[cell] = {
            "broker": [b50, b99],
            "uncached": [u50, u99],
            "uncached_p99_over_floor": u99 / f99,
            "redis_relay": [r50, r99],
            "redis_relay_p99_over_floor": r99 / f99,
            "uncached_p99_over_redis_relay": u99 / r99,
            "uncached_p99_over_postgres_server": u99 / w99,
            "floor": [f50, f99],
            "postgres": [p50, p99],
            "postgres_server": [w50, w99],
            "index": [i50, i99],
            "broker_p99_over_floor": b99 / f99,
            "broker_p99_over_postgres_server": b99 / w99,
            "index_p99_over_postgres": i99 / p99,
            "broker_p99_over_postgres": b99 / p99,
        }
        rows.append(
            [
                cell,
                b50,
                b99,
                u50,
                u99,
                r50,
                r99,
                w50,
                w99,
                f50,
                f99,
                i99,
                p99,
                b99 / f99,
                u99 / f99,
                r99 / f99,
                u99 / r99,
                b99 / w99,
                u99 / w99,
                i99 / p99,
            ]
        )
    text = common.table(
        f"session/list, {n:,} sessions, {PAGE} per page (ms; cwd: 1 of {CWDS} cwds)"
        + (
            f"; the tenant's index announced changed {args.announce_gap:g} ms before each turn"
            if args.announce_gap
            else ""
        ),
        [
            "listing/depth",
            "cached p50",
            "cached p99",
            "uncached p50",
            "uncached p99",
            "redis relay p50",
            "redis relay p99",
            "pg server p50",
            "pg server p99",
            "floor p50",
            "floor p99",
            "index read p99",
            "pg query p99",
            "cached ÷ floor p99 (≤1.5)",
            "uncached ÷ floor p99 (≤1.5)",
            "redis relay ÷ floor p99",
            "uncached ÷ redis relay p99",
            "cached ÷ pg server p99 (≤1)",
            "uncached ÷ pg server p99 (≤1)",
            "index read ÷ pg query p99 (≤1)",
        ],
        rows,
    )
    text += "\n\nServer CPU time (user + system) per session/list: " + ", ".join(
        f"{label} {common.median(server_cpu[name]):.0f} µs"
        for name, label in (
            ("broker", "front node (cached)"),
            ("uncached", "front node (uncached)"),
            ("redis_ws", "redis relay"),
            ("pg_ws", "pg server"),
        )
        if server_cpu[name]
    )
    for rev in args.baseline:
        order = (f"broker@{rev}", "broker", f"uncached@{rev}", "uncached")
        before = [
            [cell]
            + [
                common.median([r[system][cell][stat] for r in runs])
                for system in order
                for stat in ("p50", "p99")
            ]
            for cell in cells
        ]
        text += "\n\n" + common.table(
            f"session/list: this tree beside {rev}'s fronts (same run, ms)",
            [
                "listing/depth",
                "cached before p50",
                "cached before p99",
                "cached p50",
                "cached p99",
                "uncached before p50",
                "uncached before p99",
                "uncached p50",
                "uncached p99",
            ],
            before,
        )
    text += "\n\nThe cached front's page cache, per run (hits, misses, bypasses): " + "; ".join(
        f"{c.get('hit', 0):.0f} / {c.get('miss', 0):.0f} / {c.get('bypass', 0):.0f}"
        for c in cache_outcomes
    )
    if unavailable:
        text += f"\n\nPostgreSQL unavailable: {unavailable}"
    common.report(
        "list",
        [text],
        {
            "quick": args.quick,
            "sessions": n,
            "announce_gap_ms": args.announce_gap,
            "summary": summary,
            "front_cpu_us_per_request": server_cpu["broker"],
            "page_cache": cache_outcomes,
            "uncached_front_cpu_us_per_request": server_cpu["uncached"],
            "pg_server_cpu_us_per_request": server_cpu["pg_ws"],
            "redis_relay_cpu_us_per_request": server_cpu["redis_ws"],
            "runs": runs,
        },
        args.out,
    )


def main(argv: list[str] | None = None) -> None:
    p = common.parser("list", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy (--gil) both fronts, cached and not, and the redis relay",
    )
    common.add_baseline(p)
    p.add_argument("--systems", nargs="*", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--sessions", type=int, default=0, help="how many (default 1,000,000)")
    p.add_argument("--samples", type=int, default=0, help="requests a cell (default 3,000)")
    p.add_argument(
        "--announce-gap",
        type=float,
        default=0.0,
        metavar="MS",
        help="announce a change of the tenant's index before each turn, MS ms before its asks"
        " (the cached fronts' pages are dropped: read again, or refreshed meanwhile)",
    )
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
