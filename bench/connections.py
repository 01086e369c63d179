"""Connections: resident memory per idle connection at 10,000 connections; connects/s.

For each system one server node and N client connections (two swarm processes of lean
clients, 200 handshakes in flight each):

* **broker**: a front node (``serve --no-workers``) with an agent host; each connection
  sends ``initialize`` and ``session/resume`` of one session and then stays idle.
* **socketio** (the peer): a python-socketio node; Socket.IO connect + ``join`` a room.
* **relay** (the ceiling): the bare ``websockets`` relay; ``join ROOM``.

Memory per connection = (server RSS with N idle connections - RSS before) ÷ N.
Connects/s = N ÷ the time from the first connect to the last joined.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from bench import common
from bench.fanout import CWD, servers

SYSTEMS = ("broker", "socketio", "relay")


async def run_system(system: str, n: int, tag: str, profile: bool = False) -> dict[str, Any]:
    with common.private_redis() as redis_url:
        async with servers(system, redis_url, tag, 1) as (urls, pids, rooms):
            url, pid = urls[0], pids[0]
            await asyncio.sleep(0.5)
            before = common.rss_bytes(pid)
            async with contextlib.AsyncExitStack() as stack:
                if profile:
                    from bench.profile import recording

                    out = common.RESULTS / f"profile-connections-{system}.txt"
                    await stack.enter_async_context(recording(pid, out, gil=True))
                user0, sys0 = common.cpu_times(pid)
                swarms = []
                for i in range(2):
                    part = [{"url": url, "room": rooms[0], "n": n // 2 + (n % 2 if i == 0 else 0)}]
                    config = {
                        "system": system.partition("@")[0],
                        "targets": part,
                        "cwd": CWD,
                        "concurrency": 200,
                    }
                    swarms.append(
                        await stack.enter_async_context(
                            common.child("bench.swarm", json.dumps(config), name=f"{tag}-swarm{i}")
                        )
                    )
                readies = [json.loads(await s.expect("ready", timeout=600)) for s in swarms]
                user1, sys1 = common.cpu_times(pid)
                user, system_time = user1 - user0, sys1 - sys0
                joined = sum(r["joined"] for r in readies)
                seconds = max(r["seconds"] for r in readies)
                await asyncio.sleep(2.0)  # idle
                after = common.rss_bytes(pid)
                failures = [r.get("first_failure") for r in readies if r["failed"]]
                for swarm in swarms:
                    await swarm.send("quit")
    return {
        "system": system,
        "connections": n,
        "joined": joined,
        "failures": failures,
        "rss_before": before,
        "rss_after": after,
        "bytes_per_connection": (after - before) / joined if joined else float("nan"),
        "connects_per_s": joined / seconds if seconds else float("nan"),
        "cpu_ms_per_connect": (user + system_time) / joined * 1000 if joined else float("nan"),
        # Apart: the kernel's part (system calls, loopback TCP) moves unlike the Python part.
        "user_ms_per_connect": user / joined * 1000 if joined else float("nan"),
        "sys_ms_per_connect": system_time / joined * 1000 if joined else float("nan"),
    }


async def run(args: Any) -> None:
    common.raise_nofile()
    n = args.connections or (100 if args.quick else 10_000)
    systems = tuple(args.systems or SYSTEMS) + tuple(f"broker@{rev}" for rev in args.baseline)
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for r in range(args.runs):
        for system in common.in_turn(systems, r):
            print(f"connections: {system}, {n:,} (run {r + 1}/{args.runs})", flush=True)
            tag = f"conn-{system.replace('@', '-')}-{r}"
            profile = args.profile and r == 0 and system.startswith("broker")
            results[system].append(await run_system(system, n, tag, profile))
    rows = []
    summary = {}
    for system, runs in results.items():
        kb = common.median([x["bytes_per_connection"] for x in runs]) / 1024
        cps = common.median([x["connects_per_s"] for x in runs])
        cpu = common.median([x["cpu_ms_per_connect"] for x in runs])
        user = common.median([x["user_ms_per_connect"] for x in runs])
        kernel = common.median([x["sys_ms_per_connect"] for x in runs])
        summary[system] = {
            "kb_per_connection": kb,
            "connects_per_s": cps,
            "cpu_ms": cpu,
            "user_ms": user,
            "sys_ms": kernel,
        }
    ceiling = summary.get("relay", {}).get("connects_per_s", float("nan"))
    for system, cell in summary.items():
        joined = min(x["joined"] for x in results[system])
        cps = cell["connects_per_s"]
        cell["connects_vs_relay"] = common.ratio(cps, ceiling)
        rows.append(
            [
                system,
                joined,
                cell["kb_per_connection"],
                cps,
                cell["connects_vs_relay"],
                cell["cpu_ms"],
                cell["user_ms"],
                cell["sys_ms"],
            ]
        )
    text = common.table(
        f"Connections: {n:,} idle connections on one node",
        [
            "system",
            "joined",
            "KB RSS / idle conn (≤20)",
            "connects/s",
            "÷ relay (≥0.8)",
            "server CPU ms / connect",
            "user ms",
            "system ms",
        ],
        rows,
    )
    common.report(
        "connections",
        [text],
        {"quick": args.quick, "connections": n, "summary": summary, "runs": results},
        args.out,
    )


def main(argv: list[str] | None = None) -> None:
    p = common.parser("connections", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--connections", type=int, default=0, help="how many (default 10,000)")
    p.add_argument("--systems", nargs="*", choices=SYSTEMS)
    common.add_baseline(p)
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy (--gil) each broker front during the first run's connect burst",
    )
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
