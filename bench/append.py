"""Append: events/s through the append script with fan-out, one agent host, vs raw XADD.

In one run, alternating round by round so the machine's noise hits all alike:

* **agent host**: a real agent host (``worker agent-host``) runs the demo agent; a client
  connected to a front node sends ``session/prompt`` with ``/chunks N``: the agent writes N
  ``agent_message_chunk`` updates to its stdout as fast as it can, the agent host appends
  each one through the append script (XADD, snapshot, feed, SPUBLISH), the front node
  fans it out to the client, and the prompt is answered once the client has been sent all
  N. Events/s = N ÷ the prompt's round trip.
* **append script**: this process appends the same updates with the append script, one
  after another (``SessionLog.append``) and 64 per round trip (``SessionLog.append_many``,
  what the agent host does with the updates that pile up while an append is on its way),
  while the client above watches the session through the front node.
* **raw XADD** (the ceiling): the same bodies, ``XADD`` one after another from one
  redis-py client, and 64 per round trip (pipelined).
* with ``--baseline REV``: the append script rows again with the appender of git revision
  REV (its ``store/appends.py`` and its Lua scripts; the rest of the Python is this tree's),
  in the same rounds: what a change to the append path costs. And Redis's own time per
  script call (``INFO commandstats``), this tree's scripts and REV's each on a private
  server, in alternated rounds: the scripts' cost without the clients' noise.
* with ``--wait-replicas``: Redis gets a replica (every row then pays for replication),
  and the append script runs again with ``redis_wait_replicas`` = 1 (each call followed by
  ``WAIT 1``): the cost of an acknowledged event surviving the loss of the master.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import inspect
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.acp import acp_client

CWD = "/srv/bench"
TENANT = "default"


def body(i: int) -> dict[str, Any]:
    update = {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": f"chunk {i}"},
    }
    return {"type": "update", "update": update}


def baseline_log(store: Any, rev: str) -> Any:
    """A ``SessionLog`` whose appender is revision ``rev``'s: its ``store/appends.py``, loaded
    into this tree's ``broker.store`` package, appending with its own Lua scripts."""
    from broker.store.log import SessionLog

    tree = common.baseline_tree(rev)
    name = f"broker.store._appends_{rev.replace('/', '_').replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, tree / "broker" / "store" / "appends.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    lua = Path(tree) / "broker" / "store" / "lua"
    setattr(module, "lua_script", lambda script: (lua / script).read_text())  # noqa: B010
    log = SessionLog(store)
    mine = log.appender
    log.appender = module.LogAppender(
        store,
        direct=mine.direct_appends,
        restore=log.restore,
        feed_maxlen=mine.feed_maxlen,
        max_events=mine.max_events,
    )
    if "restore" not in inspect.signature(log.appender.append_many).parameters:
        # A revision before archived sessions' events could be refused rather than restored:
        # it always restored, as this tree's default does.
        older = log.appender.append_many

        async def append_many(items: Any, calls: Any = None, *, restore: bool = True) -> Any:
            return await older(items, calls)

        setattr(log.appender, "append_many", append_many)  # noqa: B010  # a method's stand-in
    return log


async def run_once(args: Any, n: int, rounds: int) -> dict[str, list[float]]:
    import redis.asyncio as redis

    from broker.store.client import connect
    from broker.store.events import dumps
    from broker.store.log import SessionLog

    rates: dict[str, list[float]] = {
        name: []
        for name in (
            ["append script, one at a time, WAIT 1", "append script, 64 per round trip, WAIT 1"]
            if args.wait_replicas
            else []
        )
    }
    for rev in args.baseline:
        rates[f"append script, one at a time ({rev})"] = []
        rates[f"append script, 64 per round trip ({rev})"] = []
    rates |= {
        "agent host": [],
        "append script, one at a time": [],
        "raw XADD, one at a time": [],
        "append script, 64 per round trip": [],
        "raw XADD, 64 per round trip": [],
    }
    with contextlib.ExitStack() as servers:
        url = servers.enter_context(common.private_redis())
        if args.wait_replicas:
            servers.enter_context(common.replica_of(url))
        async with (
            common.agent_host(url, "append"),
            common.fronts(url, 1, "append") as nodes,
            acp_client(nodes[0].url) as client,
        ):
            session = await client.new_session(CWD)
            received = 0
            caught_up = asyncio.Event()
            wanted = 0

            def count(text: str) -> None:
                nonlocal received
                received += 1
                if received >= wanted:
                    caught_up.set()

            client.on_notification = count
            store = connect(url)
            log = SessionLog(store)
            waiting = SessionLog(store)
            waiting.wait_for_replicas(1, 5.0)
            raw = redis.Redis.from_url(url, decode_responses=True)
            bodies = [dumps(body(i)) for i in range(n)]

            async def agent_host() -> float:
                t = time.perf_counter()
                prompt = [{"type": "text", "text": f"/chunks {n}"}]
                await client.request(
                    "session/prompt", {"sessionId": session, "prompt": prompt}, timeout=300
                )
                return n / (time.perf_counter() - t)

            # The rows with WAIT append to a session of their own (a session holds at most
            # max_events_per_session events).
            waited = await client.new_session(CWD) if args.wait_replicas else session

            async def append_script(log: SessionLog = log, session: str = session) -> float:
                nonlocal wanted
                wanted = received + n
                caught_up.clear()
                t = time.perf_counter()
                for i in range(n):
                    await log.append(TENANT, session, body(i))
                took = time.perf_counter() - t
                await asyncio.wait_for(caught_up.wait(), 60)  # the watcher got them all
                return n / took

            async def append_pipelined(log: SessionLog = log, session: str = session) -> float:
                nonlocal wanted
                wanted = received + n
                caught_up.clear()
                t = time.perf_counter()
                for start in range(0, n, 64):
                    items = [
                        (TENANT, session, body(i), "") for i in range(start, min(n, start + 64))
                    ]
                    for result in await log.append_many(items):
                        if isinstance(result, Exception):
                            raise result
                took = time.perf_counter() - t
                await asyncio.wait_for(caught_up.wait(), 60)
                return n / took

            async def raw_xadd() -> float:
                t = time.perf_counter()
                for text in bodies:
                    await raw.xadd("bench:raw", {"ts": "1780000000000", "ev": text})
                return n / (time.perf_counter() - t)

            async def raw_pipelined() -> float:
                t = time.perf_counter()
                for start in range(0, n, 64):
                    async with raw.pipeline(transaction=False) as pipe:
                        for text in bodies[start : start + 64]:
                            pipe.xadd("bench:raw2", {"ts": "1780000000000", "ev": text})
                        await pipe.execute()
                return n / (time.perf_counter() - t)

            systems = {
                "agent host": agent_host,
                "append script, one at a time": append_script,
                "raw XADD, one at a time": raw_xadd,
                "append script, 64 per round trip": append_pipelined,
                "raw XADD, 64 per round trip": raw_pipelined,
            }
            for rev in args.baseline:
                # Its own session: a baseline appender knows nothing of this one's floors.
                other = await client.new_session(CWD)
                base = baseline_log(store, rev)
                systems[f"append script, one at a time ({rev})"] = functools.partial(
                    append_script, base, other
                )
                systems[f"append script, 64 per round trip ({rev})"] = functools.partial(
                    append_pipelined, base, other
                )
            if args.wait_replicas:
                systems["append script, one at a time, WAIT 1"] = functools.partial(
                    append_script, waiting, waited
                )
                systems["append script, 64 per round trip, WAIT 1"] = functools.partial(
                    append_pipelined, waiting, waited
                )
            for fn in systems.values():  # warm-up
                await fn()
            for r in range(rounds):
                for name in common.in_turn(list(systems), r):
                    rates[name].append(await systems[name]())
            await store.aclose()
            await raw.aclose()
    return rates


async def script_time(rev: str, n: int, rounds: int) -> dict[str, list[float]]:
    """Redis's µs per event of the append scripts, this tree's and ``rev``'s, each appending
    to a private server: one at a time and 64 per call, ``n`` events a round."""
    import redis as sync_redis

    from broker.store.client import connect
    from broker.store.log import SessionLog

    created = {"type": "created", "cwd": CWD, "agent": "demo", "kind": "shell"}
    times: dict[str, list[float]] = {}
    with common.private_redis() as mine_url, common.private_redis() as base_url:
        stores = {"": connect(mine_url), f" ({rev})": connect(base_url)}
        logs = {"": SessionLog(stores[""]), f" ({rev})": baseline_log(stores[f" ({rev})"], rev)}
        urls = {"": mine_url, f" ({rev})": base_url}
        for log in logs.values():
            await log.create(TENANT, "one", created)
            await log.create(TENANT, "many", created)
        for r in range(rounds):
            for tag in common.in_turn(list(logs), r):
                log, admin = logs[tag], sync_redis.Redis.from_url(urls[tag])
                for many in (False, True):
                    admin.config_resetstat()
                    if many:
                        for start in range(0, n, 64):
                            items = [
                                (TENANT, "many", body(i), "") for i in range(start, start + 64)
                            ]
                            await log.append_many(items)
                    else:
                        for i in range(n):
                            await log.append(TENANT, "one", body(i))
                    stats = admin.info("commandstats")["cmdstat_evalsha"]
                    name = f"{'64 per call' if many else 'one at a time'}{tag}"
                    per_event = stats["usec_per_call"] / (64 if many else 1)
                    times.setdefault(name, []).append(per_event)
                admin.close()
        for store in stores.values():
            await store.aclose()
    return times


async def run(args: Any) -> None:
    n = 200 if args.quick else 10_000
    rounds = 1 if args.quick else 5
    all_rates: dict[str, list[float]] = {}
    for r in range(args.runs):
        print(f"append: {n:,} events x {rounds} rounds (run {r + 1}/{args.runs})", flush=True)
        common.extend_each(all_rates, await run_once(args, n, rounds))
    med = {name: common.median(values) for name, values in all_rates.items()}
    ceiling = med["raw XADD, one at a time"]
    piped = med["raw XADD, 64 per round trip"]
    rows = [[name, value, value / ceiling, value / piped] for name, value in med.items()]
    rounds_done = len(all_rates["raw XADD, one at a time"])
    text = common.table(
        f"Append, {n:,} events per round, median of {rounds_done} rounds",
        ["path", "events/s", "÷ raw XADD one at a time (≥0.5)", "÷ raw XADD 64 per trip"],
        rows,
    )
    tables, data = [text], {"quick": args.quick, "events": n, "median": med, "rounds": all_rates}
    for rev in args.baseline:
        times = await script_time(rev, min(n, 3000), 2 * rounds)
        base = {name: common.median(v) for name, v in times.items()}
        rows = [
            [name, value, "" if name.endswith(f"({rev})") else value / base[f"{name} ({rev})"]]
            for name, value in base.items()
        ]
        tables.append(
            common.table(
                f"Redis's time per event in the append scripts (INFO commandstats), vs {rev}",
                ["script call", "µs per event", f"÷ {rev}"],
                rows,
            )
        )
        data[f"script µs per event vs {rev}"] = times
    common.report("append", tables, data, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("append", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument(
        "--wait-replicas",
        action="store_true",
        help="give Redis a replica and add the append script with WAIT 1 (redis_wait_replicas)",
    )
    common.add_baseline(p)
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
