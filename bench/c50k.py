"""C50K: 50,000 idle connections on one front; memory per connection, fan-out beside them.

Two front nodes (``serve --no-workers``) and an agent host on one private Redis:

* **crowded**: a front with N connections, each after ``initialize`` + ``session/resume``
  (as ``bench connections`` makes them): ``--hot`` of them watch the hot session, the
  rest resume an idle session and stay idle (swarm processes of lean clients, each from
  its own loopback source address, so that the ephemeral port range is no limit);
* **alone**: a second front with only the ``--hot`` watchers of a second hot session.

Resident memory per connection = (the crowded front's RSS with its N connections - its
RSS before any) ÷ N, once every connection has had its first keepalive Ping (one ping
interval after the joins: a connection pinged and ponged holds more than one just joined);
the same 2 s after the joins is shown beside it. Then, in alternating rounds, each hot
session is fed at ``--rate`` updates/s (as ``bench fanout`` feeds it:
``SessionLog.append_many``, one ``agent_message_chunk`` stamped with its send time) and
its watchers' latency and the front's CPU per delivery are measured: the p99 of a fan-out
to the hot watchers of the crowded front ÷ the same fan-out on the front with nothing else.

One front cannot hold more connections than its open-file limit allows; when the hard
``RLIMIT_NOFILE`` (or ``fs.nr_open``) is below what N needs, the run says so and runs
the most that fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common
from bench.acp import new_sessions
from bench.fanout import CWD, Running, broker_feeder, measure
from broker.config import Settings

PER_SWARM = 10_000
"""Idle connections per client process (its own open files stay well under any limit)."""
FRONT_FILES = 512
"""Open files a front needs besides its client connections (Redis, listeners, logs)."""
PING_INTERVAL = Settings.model_fields["ping_interval"].default
"""Seconds until every connection has had its first keepalive Ping (a front's default;
``--quick`` runs its fronts with 2 s)."""
QUICK_PING_INTERVAL = 2.0

SwarmJob = tuple[str, str, int, str, str | None]
"""One swarm process: front URL, room, connections, name, source address (or none)."""


@dataclass(frozen=True)
class Plan:
    asked: int
    connections: int
    hot: int
    limited_by: str | None

    @property
    def idle(self) -> int:
        return self.connections - self.hot


def file_limit() -> tuple[int, str]:
    """How many files one process may open here, and what sets that bound."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
    if hard == resource.RLIM_INFINITY or hard > nr_open:
        return nr_open, f"fs.nr_open = {nr_open:,}"
    return hard, (
        f"the hard RLIMIT_NOFILE = {hard:,} (soft {soft:,}; raising the hard limit needs "
        "CAP_SYS_RESOURCE or a higher LimitNOFILE / ulimit -Hn from the parent)"
    )


def ports_per_address() -> int:
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return high - low + 1


def plan(asked: int, hot: int) -> Plan:
    """The run that fits this machine: ``asked`` connections, or the most one front can
    hold, saying what bounds it."""
    limit, reason = file_limit()
    fits = limit - FRONT_FILES
    system_files = int(Path("/proc/sys/fs/file-max").read_text().split()[0])
    if 2 * asked + 10 * FRONT_FILES > system_files:  # both ends of each connection are here
        fits = min(fits, (system_files - 10 * FRONT_FILES) // 2)
        reason = f"fs.file-max = {system_files:,} (both ends of every connection)"
    if ports_per_address() < PER_SWARM:
        raise SystemExit(f"c50k: the ephemeral port range holds fewer than {PER_SWARM:,} ports")
    if asked <= fits:
        return Plan(asked, asked, min(hot, asked), None)
    return Plan(asked, fits, min(hot, fits), reason)


@contextlib.asynccontextmanager
async def swarm(
    url: str, room: str, n: int, name: str, local_host: str | None = None
) -> AsyncIterator[tuple[common.Child, dict[str, Any]]]:
    """A swarm process (``bench/swarm.py``) of ``n`` connections resuming ``room``; yields
    it and its ``ready`` report once all have joined."""
    config: dict[str, Any] = {
        "system": "broker",
        "targets": [{"url": url, "room": room, "n": n}],
        "cwd": CWD,
        "concurrency": 200,
    }
    if local_host:
        config["local_host"] = local_host
    async with common.child("bench.swarm", json.dumps(config), name=name) as child:
        yield child, json.loads(await child.expect("ready", timeout=900))
        await child.send("quit")


async def join_all(
    stack: contextlib.AsyncExitStack, jobs: list[SwarmJob]
) -> list[tuple[common.Child, dict[str, Any]]]:
    """Start the swarms side by side; each stays up until ``stack`` closes."""
    return list(await asyncio.gather(*(stack.enter_async_context(swarm(*job)) for job in jobs)))


def hot_jobs(url: str, room: str, hot: int, tag: str) -> list[SwarmJob]:
    """The hot watchers of one front, over two swarm processes (as ``bench fanout``)."""
    halves = [hot - hot // 2, hot // 2]
    return [(url, room, n, f"{tag}-{i}", None) for i, n in enumerate(halves) if n]


def idle_jobs(url: str, room: str, idle: int, tag: str) -> list[SwarmJob]:
    """The idle connections, ``PER_SWARM`` a process, each from 127.0.0.(2 + i)."""
    jobs: list[SwarmJob] = []
    for i, start in enumerate(range(0, idle, PER_SWARM)):
        n = min(PER_SWARM, idle - start)
        jobs.append((url, room, n, f"{tag}-{i}", f"127.0.0.{2 + i}"))
    return jobs


def failures(readies: list[dict[str, Any]]) -> list[str]:
    return [r.get("first_failure", "") for r in readies if r["failed"]]


async def run_once(
    p: Plan, rounds: int, rate: float, seconds: float, ping_interval: float
) -> dict[str, Any]:
    tag = "c50k"
    with common.private_redis() as redis_url:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(common.agent_host(redis_url, tag))
            env = {"ACP_BROKER_PING_INTERVAL": str(ping_interval)}
            crowded, alone = await stack.enter_async_context(
                common.fronts(redis_url, 2, tag, env=env)
            )
            hot_a, hot_b, idle_room = await new_sessions(crowded.url, 3, CWD)
            await asyncio.sleep(1.0)
            before = common.rss_bytes(crowded.pid)
            cpu0 = common.cpu_seconds(crowded.pid)
            t0 = asyncio.get_running_loop().time()
            hot = hot_jobs(crowded.url, hot_a, p.hot, f"{tag}-crowded-hot")
            idle = idle_jobs(crowded.url, idle_room, p.idle, f"{tag}-idle")
            crowded_swarms = await join_all(stack, hot + idle)
            join_seconds = asyncio.get_running_loop().time() - t0
            join_cpu = common.cpu_seconds(crowded.pid) - cpu0
            alone_swarms = await join_all(
                stack, hot_jobs(alone.url, hot_b, p.hot, f"{tag}-alone-hot")
            )
            await asyncio.sleep(2.0)  # idle
            joined_rss = common.rss_bytes(crowded.pid)
            await asyncio.sleep(ping_interval)  # each pinged once
            after = common.rss_bytes(crowded.pid)
            readies = [r for _, r in crowded_swarms + alone_swarms]
            joined = sum(r["joined"] for _, r in crowded_swarms)
            watching = {"crowded": crowded_swarms[: len(hot)], "alone": alone_swarms}
            cells = {
                "crowded": (crowded.pid, hot_a, [c for c, _ in watching["crowded"]]),
                "alone": (alone.pid, hot_b, [c for c, _ in watching["alone"]]),
            }
            hot_joined = {k: sum(r["joined"] for _, r in v) for k, v in watching.items()}
            send, close = await broker_feeder(redis_url)
            stack.push_async_callback(close)
            got: dict[str, list[dict[str, Any]]] = {"crowded": [], "alone": []}
            runs = {
                name: Running(name, send, swarms, [pid], [room], hot_joined[name])
                for name, (pid, room, swarms) in cells.items()
            }
            for name in ("crowded", "alone"):  # warm-up
                await measure([runs[name]], 4, None)
            for k in range(rounds):
                order = ("crowded", "alone") if k % 2 == 0 else ("alone", "crowded")
                print(f"c50k: fan-out round {k + 1}/{rounds}", flush=True)
                for name in order:
                    count = int(rate * seconds)
                    got[name].append((await measure([runs[name]], count, rate))[name])
            rss_end = common.rss_bytes(crowded.pid)
    return {
        "connections": p.connections,
        "joined": joined,
        "hot_joined": hot_joined,
        "failures": failures(readies),
        "rss_before": before,
        "rss_joined": joined_rss,
        "rss_after": after,
        "rss_end": rss_end,
        "bytes_per_connection": (after - before) / joined if joined else float("nan"),
        "bytes_per_connection_joined": (joined_rss - before) / joined if joined else float("nan"),
        "connects_per_s": joined / join_seconds if join_seconds else float("nan"),
        "cpu_ms_per_connect": join_cpu / joined * 1000 if joined else float("nan"),
        "rounds": got,
    }


def summarize(p: Plan, runs: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    kb = common.median([r["bytes_per_connection"] for r in runs]) / 1024
    kb_joined = common.median([r["bytes_per_connection_joined"] for r in runs]) / 1024
    joined = min(r["joined"] for r in runs)
    title = f"C50K: {p.connections:,} connections on one front"
    if p.limited_by:
        title += f" (asked {p.asked:,}; limited by {p.limited_by})"
    memory = common.table(
        title,
        [
            "joined",
            "KB RSS / connection, each pinged (≤ 15)",
            "2 s after the joins",
            "connects/s",
            "front CPU ms / connect",
            "failed",
        ],
        [
            [
                joined,
                kb,
                kb_joined,
                common.median([r["connects_per_s"] for r in runs]),
                common.median([r["cpu_ms_per_connect"] for r in runs]),
                sum(len(r["failures"]) for r in runs),
            ]
        ],
    )
    rows, ratios = [], []
    for i, (crowded, alone) in enumerate(
        (c, a)
        for r in runs
        for c, a in zip(r["rounds"]["crowded"], r["rounds"]["alone"], strict=True)
    ):
        ratio = common.ratio(crowded["p99_ms"], alone["p99_ms"])
        ratios.append(ratio)
        for name, m in (("crowded", crowded), ("alone", alone)):
            rows.append(
                [
                    i + 1,
                    name,
                    m["delivered"],
                    m["lost"],
                    m["p50_ms"],
                    m["p99_ms"],
                    m["p999_ms"],
                    m["cpu_us_per_delivery"],
                    ratio if name == "crowded" else None,
                ]
            )
    hot = runs[0]["hot_joined"]["crowded"]
    fanout = common.table(
        f"Fan-out to {hot:,} watchers: beside {joined - hot:,} idle connections (crowded) "
        "and on a front of its own (alone)",
        [
            "round",
            "front",
            "delivered",
            "lost",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "CPU µs/deliv",
            "p99 crowded ÷ alone (≤ 1.5)",
        ],
        rows,
    )
    summary = {
        "kb_per_connection": kb,
        "p99_ratio_median": common.median(ratios),
        "p99_ratios": ratios,
        "holds": {"memory": kb <= 15, "p99": all(r <= 1.5 for r in ratios)},
    }
    return [memory, fanout], summary


async def run(args: Any) -> None:
    common.raise_nofile(1 << 20)
    asked = args.connections or (2_000 if args.quick else 50_000)
    hot = args.hot or (100 if args.quick else 1_000)
    p = plan(asked, hot)
    if p.limited_by:
        print(
            f"c50k: {asked:,} connections on one front need {asked + FRONT_FILES:,} open files; "
            f"{p.limited_by}: running {p.connections:,}",
            flush=True,
        )
    rounds = args.rounds or (2 if args.quick else 4)
    seconds = args.seconds or (2.0 if args.quick else 10.0)
    runs = []
    for r in range(args.runs):
        print(f"c50k: {p.connections:,} connections (run {r + 1}/{args.runs})", flush=True)
        ping_interval = QUICK_PING_INTERVAL if args.quick else PING_INTERVAL
        runs.append(await run_once(p, rounds, args.rate, seconds, ping_interval))
    tables, summary = summarize(p, runs)
    data = {
        "quick": args.quick,
        "asked": p.asked,
        "connections": p.connections,
        "hot": p.hot,
        "limited_by": p.limited_by,
        "summary": summary,
        "runs": runs,
    }
    common.report("c50k", tables, data, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("c50k", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--connections", type=int, default=0, help="on one front (default 50,000)")
    p.add_argument("--hot", type=int, default=0, help="of them watching the fan-out (1,000)")
    p.add_argument("--rounds", type=int, default=0, help="alternating fan-out rounds (4)")
    p.add_argument("--rate", type=float, default=20.0, help="updates/s during a round (20)")
    p.add_argument("--seconds", type=float, default=0.0, help="length of a round (10)")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
