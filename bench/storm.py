"""Reconnect storm: a front holding thousands of connections is killed; all resume elsewhere.

Two fronts (``serve --no-workers``) and an agent host on a private Redis, S sessions made
with ``session/new``. The front to be killed holds W watchers of each session (S x W
connections), the survivor one watcher of each; every watcher sent ``initialize`` and
``session/resume`` (``bench/storm_clients.py``, two client processes). This process stands
in for the agent host and logs one ``agent_message_chunk`` per session (the warm-up, which
every watcher must see), then keeps logging updates at ``--rate`` events/s (all sessions
together, round robin) as ``bench fanout`` does, and SIGKILLs the first front while they
flow. Every watcher of the dead front reconnects to the survivor and resumes from the last
position it saw (``_meta["acpBroker/replayAfter"]``), at most ``concurrency`` handshakes in
flight per client process.

Reported: the time from the kill until every watcher is resumed (its ``session/resume``
answered), the watchers' resume times (p50, p99), the survivor's CPU over the storm, and
whether every watcher received every event from the warm-up to the session's last exactly
once (nothing lost, nothing duplicated). ``--baseline REV`` runs the same storm against the
fronts of another revision, in turn. ``--bridges N`` runs the editors' case instead: N stdio
bridges (``acp-broker connect``) mid-turn whose front dies (``bench/storm_bridges.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from bench import common
from bench.acp import new_sessions
from bench.fanout import CWD, TENANT, update_body

STORM_SECONDS = 120.0
"""The longest a storm may take (kill to all resumed) before the run is given up."""
SETTLE_SECONDS = 60.0


@dataclass(frozen=True)
class Size:
    sessions: int
    watchers: int  # per session, on the front that dies
    rate: float  # events/s over all sessions while the storm runs


FULL = Size(500, 10, 500)
QUICK = Size(10, 5, 50)


@dataclass
class Fronts:
    urls: list[str]
    pids: list[int]
    kill: Any  # () -> Awaitable: SIGKILL the first front


@contextlib.asynccontextmanager
async def fronts_of(system: str, redis_url: str, tag: str) -> AsyncIterator[Fronts]:
    """The agent host and the 2 fronts of ``system`` (``broker`` or ``broker@REV``)."""
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(common.agent_host(redis_url, tag))
        if system == "broker":
            nodes = await stack.enter_async_context(common.fronts(redis_url, 2, tag))
            yield Fronts([n.url for n in nodes], [n.pid for n in nodes], nodes[0].kill)
            return
        tree = common.baseline_tree(system.partition("@")[2])
        pairs = await stack.enter_async_context(common.fronts_at(tree, redis_url, 2, tag))

        async def kill() -> None:
            import os
            import signal

            os.kill(pairs[0][1], signal.SIGKILL)

        yield Fronts([u for u, _ in pairs], [p for _, p in pairs], kill)


class Feeder:
    """Logs updates to the sessions as an agent host does, and knows each one's last seq."""

    def __init__(self, redis_url: str) -> None:
        from broker.store.client import connect
        from broker.store.log import SessionLog

        self.store = connect(redis_url)
        self.log = SessionLog(self.store)
        self.last: dict[str, int] = {}

    async def send(self, sessions: list[str]) -> None:
        body = {"type": "update", "update": update_body(time.time())}
        results = await self.log.append_many([(TENANT, s, body, "") for s in sessions])
        for session, result in zip(sessions, results, strict=True):
            if isinstance(result, Exception):
                raise result
            self.last[session] = max(self.last.get(session, 0), result.seq)

    async def run(self, sessions: list[str], rate: float, stop: asyncio.Event) -> int:
        """Round robin over ``sessions`` at ``rate``/s until ``stop`` (or STORM_SECONDS)."""
        start = time.monotonic()
        sent = 0
        while not stop.is_set() and time.monotonic() - start < STORM_SECONDS + SETTLE_SECONDS:
            due = int((time.monotonic() - start) * rate) + 1
            batch = [sessions[i % len(sessions)] for i in range(sent, due)]
            sent = due
            for at in range(0, len(batch), 64):
                await self.send(batch[at : at + 64])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    stop.wait(), max(0.0, start + sent / rate - time.monotonic())
                )
        return sent

    async def close(self) -> None:
        await self.store.aclose()


async def ask_all(clients: list[common.Child], command: str, answer: str) -> list[str]:
    out = []
    for client in clients:
        await client.send(command)
        out.append(await client.expect(answer, timeout=60))
    return out


async def run_storm(system: str, size: Size, tag: str, profile: bool) -> dict[str, Any]:
    with common.private_redis() as redis_url:
        async with fronts_of(system, redis_url, tag) as fronts:
            victim, survivor = fronts.urls
            sessions = await new_sessions(survivor, size.sessions, CWD)
            targets: list[list[dict[str, Any]]] = [[], []]
            for i, session in enumerate(sessions):
                n = size.watchers
                targets[0].append({"url": victim, "session": session, "n": n - n // 2})
                targets[1].append({"url": victim, "session": session, "n": n // 2})
                targets[i % 2].append({"url": survivor, "session": session, "n": 1})
            feeder = Feeder(redis_url)
            async with contextlib.AsyncExitStack() as stack:
                stack.push_async_callback(feeder.close)
                clients = []
                for i, part in enumerate(targets):
                    config = {"targets": part, "survivor": survivor, "cwd": CWD, "concurrency": 200}
                    clients.append(
                        await stack.enter_async_context(
                            common.child(
                                "bench.storm_clients", json.dumps(config), name=f"{tag}-clients{i}"
                            )
                        )
                    )
                readies = [json.loads(await c.expect("ready", timeout=600)) for c in clients]
                joined = sum(r["joined"] for r in readies)
                expected = size.sessions * (size.watchers + 1)
                if joined != expected:
                    raise RuntimeError(f"{system}: {joined} of {expected} joined: {readies}")
                # The warm-up: one event per session, which every watcher must see first.
                await feeder.send(sessions)
                first = dict(feeder.last)
                deadline = common.Deadline(30)
                while deadline:
                    primed = sum(int(x) for x in await ask_all(clients, "primed", "primed"))
                    if primed == joined:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise RuntimeError(f"{system}: only {primed} of {joined} saw the warm-up")
                stop = asyncio.Event()
                feeding = asyncio.create_task(feeder.run(sessions, size.rate, stop))
                await asyncio.sleep(1.0)
                moving = size.sessions * size.watchers
                async with contextlib.AsyncExitStack() as profiling:
                    if profile:
                        from bench.profile import recording

                        out = common.RESULTS / f"profile-storm-{system.replace('@', '-')}.txt"
                        await profiling.enter_async_context(
                            recording(fronts.pids[1], out, gil=True)
                        )
                    cpu0 = common.cpu_seconds(fronts.pids[1])
                    killed_at = time.time()
                    await fronts.kill()
                    status: dict[str, int] = {}
                    deadline = common.Deadline(STORM_SECONDS)
                    while deadline:
                        statuses = [
                            json.loads(s) for s in await ask_all(clients, "status", "status")
                        ]
                        status = {k: sum(s[k] for s in statuses) for k in statuses[0]}
                        if status["resumed"] + status["given_up"] >= moving:
                            break
                        await asyncio.sleep(0.05)
                    storm_cpu = common.cpu_seconds(fronts.pids[1]) - cpu0
                await asyncio.sleep(2.0)  # events keep flowing to the resumed watchers
                stop.set()
                sent = await feeding
                final = dict(feeder.last)
                maps = json.dumps({"first": first, "final": final})
                deadline = common.Deadline(SETTLE_SECONDS)
                while True:
                    checks = [
                        json.loads(c) for c in await ask_all(clients, f"check {maps}", "check")
                    ]
                    exact = sum(c["exact"] for c in checks)
                    if exact == joined or not deadline:
                        break
                    await asyncio.sleep(0.2)
                for client in clients:
                    await client.send("quit")
    resumed_at = [t for c in checks for t in c["resumed_at"] if t]
    took = [t - killed_at for t in resumed_at]
    return {
        "system": system,
        "sessions": size.sessions,
        "connections": joined,
        "moved": moving,
        "resumed": len(resumed_at),
        "given_up": status.get("given_up", 0),
        "all_resumed_s": max(took) if len(took) == moving else float("nan"),
        "resume_p50_s": common.percentile(took, 50),
        "resume_p99_s": common.percentile(took, 99),
        "attempts": sum(c["attempts"] for c in checks),
        "errors": sorted({e for c in checks for e in c["errors"]})[:5],
        "survivor_cpu_s": storm_cpu,
        "events_sent": sent + len(sessions),
        "exact": exact,
        "lost": sum(c["lost"] for c in checks),
        "duplicated": sum(c["duplicated"] for c in checks),
        "gaps": sum(c["gaps"] for c in checks),
    }


async def run(args: Any) -> None:
    common.raise_nofile()
    size = QUICK if args.quick else FULL
    if args.sessions or args.watchers or args.rate:
        size = Size(
            args.sessions or size.sessions, args.watchers or size.watchers, args.rate or size.rate
        )
    systems = ("broker", *(f"broker@{rev}" for rev in args.baseline))
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for r in range(args.runs):
        for system in common.in_turn(systems, r):
            print(f"storm: {system} (run {r + 1}/{args.runs})", flush=True)
            tag = f"storm-{system.replace('@', '-')}-{r}"
            cell = await run_storm(system, size, tag, args.profile and r == 0)
            print(f"  {json.dumps(cell)}", flush=True)
            results[system].append(cell)
    rows = []
    for system, runs in results.items():
        rows.append(
            [
                system,
                runs[0]["moved"],
                common.median([x["all_resumed_s"] for x in runs]),
                common.median([x["resume_p50_s"] for x in runs]),
                common.median([x["resume_p99_s"] for x in runs]),
                common.median([x["survivor_cpu_s"] for x in runs]),
                min(x["exact"] for x in runs),
                runs[0]["connections"],
                max(x["lost"] for x in runs),
                max(x["duplicated"] for x in runs),
            ]
        )
    text = common.table(
        f"Reconnect storm: {size.sessions:,} sessions, {size.sessions * size.watchers:,}"
        f" connections on the killed front, {size.rate:g} events/s",
        [
            "system",
            "moved",
            "kill → all resumed s (<10)",
            "resume p50 s",
            "resume p99 s",
            "survivor CPU s",
            "exactly once",
            "of",
            "lost",
            "duplicated",
        ],
        rows,
    )
    data = {"quick": args.quick, "size": size.__dict__, "runs": results}
    common.report("storm", [text], data, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("storm", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument(
        "--bridges",
        type=int,
        default=0,
        help="instead: N editors' stdio bridges mid-turn, their front stopped (SIGTERM, then "
        "SIGKILL) and replaced on the same address (bench/storm_bridges.py)",
    )
    p.add_argument("--sessions", type=int, default=0, help="sessions (default 500)")
    p.add_argument("--watchers", type=int, default=0, help="per session on the killed front (10)")
    p.add_argument("--rate", type=float, default=0, help="events/s during the storm (500)")
    common.add_baseline(p)
    p.add_argument("--profile", action="store_true", help="py-spy --gil the survivor's storm")
    args = p.parse_args(argv)
    if args.bridges:
        from bench import storm_bridges

        asyncio.run(storm_bridges.run(args))
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
