"""Replay: a session of 10,000 events replayed to a client (events/s) vs raw XRANGE + send.

* **broker**: a fresh connection sends ``initialize`` and ``session/load`` for a session whose
  log holds N events; the front reads the log and sends every event, then the reply.
  Events/s = N ÷ (request sent → reply received).
* **broker v2**: the same as an ACP v2 client replays it (the web console's way):
  ``session/resume`` with ``replayFrom: {"type": "start"}``, every event a v2
  ``session/update`` (message chunks with their turn's ``messageId``).
* **ceiling**: the bare relay (``bench/peers/relay.py``) reads the same stream with one
  ``XRANGE`` and sends each entry as a frame (``websockets.broadcast`` to one connection),
  then ``done``.

Both are timed from the same lean client, taking turns round by round. ``--baseline REV``
adds a front running the broker as of REV (the same Redis, session and agent host), timed in
the same rounds: before/after side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from bench import common
from bench.acp import new_sessions
from bench.wsclient import connect

CWD = "/srv/bench"
TENANT = "default"


async def fill(url: str, session: str, n: int) -> None:
    from broker.store.client import connect as store_connect
    from broker.store.log import SessionLog

    store = store_connect(url)
    log = SessionLog(store)
    for start in range(0, n, 100):
        await asyncio.gather(
            *(
                log.append(
                    TENANT,
                    session,
                    {
                        "type": "update",
                        "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": f"replayed chunk number {i}"},
                        },
                    },
                )
                for i in range(start, min(n, start + 100))
            )
        )
    await store.aclose()


V2 = " v2"
"""The suffix of a front's name in its v2 client's rows."""


def _replay_request(session: str, version: int) -> dict[str, Any]:
    """The request that replays the whole session: v1 ``session/load``, v2 ``session/resume``
    from the start."""
    if version == 1:
        load = {"sessionId": session, "cwd": CWD, "mcpServers": []}
        return {"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": load}
    resume = {"sessionId": session, "cwd": CWD, "replayFrom": {"type": "start"}}
    return {"jsonrpc": "2.0", "id": 2, "method": "session/resume", "params": resume}


async def broker_replay(url: str, session: str, version: int = 1) -> tuple[float, int]:
    frames = 0
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_text(payload: bytes) -> None:
        nonlocal frames
        if payload.startswith(b'{"jsonrpc":"2.0","method":"session/update"'):
            frames += 1
        elif b'"id":2' in payload and not done.done():
            done.set_result(None)
        elif b'"id":1' in payload and not ready.done():
            ready.set_result(None)

    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    client = await connect(url, on_text)
    capabilities = "clientCapabilities" if version == 1 else "capabilities"
    init = {"protocolVersion": version, capabilities: {}}
    client.send_text(
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
    )
    await asyncio.wait_for(ready, 30)
    t = time.perf_counter()
    client.send_text(json.dumps(_replay_request(session, version)))
    await asyncio.wait_for(done, 120)
    took = time.perf_counter() - t
    client.close()
    return took, frames


async def relay_replay(url: str, key: str, session: str) -> tuple[float, int]:
    frames = 0
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_text(payload: bytes) -> None:
        nonlocal frames
        if payload == b"done":
            done.set_result(None)
        elif payload.startswith(b"{"):
            frames += 1

    client = await connect(url, on_text)
    t = time.perf_counter()
    client.send_text(f"replay {key} {session}")
    await asyncio.wait_for(done, 120)
    took = time.perf_counter() - t
    client.close()
    return took, frames


async def run_once(
    n: int, rounds: int, profile: bool = False, baselines: tuple[str, ...] = ()
) -> dict[str, list[float]]:
    """Events/s of each system in each timed round: this tree's front (``broker``), each
    baseline's (``broker@REV``), the relay (``ceiling``)."""
    from broker.store.keys import SessionKeys

    rates: dict[str, list[float]] = {"broker": [], "ceiling": []}
    with common.private_redis() as url:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(common.agent_host(url, "replay"))
            nodes = await stack.enter_async_context(common.fronts(url, 1, "replay"))
            fronts = {"broker": nodes[0].url}
            for rev in baselines:
                tree = common.baseline_tree(rev)
                pairs = await stack.enter_async_context(
                    common.fronts_at(tree, url, 1, f"replay-{rev}")
                )
                fronts[f"broker@{rev}"] = pairs[0][0]
                rates[f"broker@{rev}"] = []
            relay = await stack.enter_async_context(
                common.child("bench.peers.relay", url, name="replay-relay")
            )
            relay_url = f"ws://127.0.0.1:{await relay.expect('ready')}/"
            (session,) = await new_sessions(nodes[0].url, 1, CWD)
            await fill(url, session, n)
            key = SessionKeys(TENANT, session).log
            if profile:
                from bench.profile import recording

                out = common.RESULTS / "profile-replay-broker.txt"
                async with recording(nodes[0].pid, out):
                    for _ in range(rounds):
                        await broker_replay(nodes[0].url, session)
            for name in list(fronts):
                rates[name + V2] = []
            systems = [*fronts, *(name + V2 for name in fronts), "ceiling"]
            for r in range(rounds + 1):  # the first round warms up
                for name in common.in_turn(systems, r):
                    if name == "ceiling":
                        took, frames = await relay_replay(relay_url, key, session)
                    elif name.endswith(V2):
                        front = fronts[name.removesuffix(V2)]
                        took, frames = await broker_replay(front, session, version=2)
                    else:
                        took, frames = await broker_replay(fronts[name], session)
                    if frames < n:
                        raise RuntimeError(f"{name} replayed {frames} of {n} events")
                    if r:
                        rates[name].append(frames / took)
    return rates


async def run(args: Any) -> None:
    n = 300 if args.quick else 10_000
    rounds = 1 if args.quick else 7
    rates: dict[str, list[float]] = {}
    for r in range(args.runs):
        print(f"replay: {n:,} events x {rounds} rounds (run {r + 1}/{args.runs})", flush=True)
        common.extend_each(rates, await run_once(n, rounds, args.profile, tuple(args.baseline)))
    med = {name: common.median(values) for name, values in rates.items()}
    # Each round times every system once: the ratio within a round is a side-by-side one,
    # whatever the machine did between rounds.
    paired = {
        name: common.median([b / c for b, c in zip(values, rates["ceiling"], strict=True)])
        for name, values in rates.items()
    }
    rows = [[name, value, value / med["ceiling"], paired[name]] for name, value in med.items()]
    text = common.table(
        f"Replay of a {n:,}-event session, median of {len(rates['broker'])} rounds",
        ["system", "events/s", "÷ ceiling (≥0.5)", "÷ ceiling in its round, median"],
        rows,
    )
    common.report(
        "replay",
        [text],
        {"quick": args.quick, "events": n, "median": med, "paired": paired, "rounds": rates},
        args.out,
    )


def main(argv: list[str] | None = None) -> None:
    p = common.parser("replay", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--profile", action="store_true", help="py-spy the front node first")
    common.add_baseline(p)
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
