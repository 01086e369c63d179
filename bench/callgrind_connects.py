"""Instructions a front spends per connect, counted by callgrind (immune to machine load).

``python -m bench.callgrind_connects [--tree PATH] [--connects N] [--warmup W]``: a private
redis-server, an agent host, and a front (``serve --no-workers``) of the tree at ``PATH``
(default: this one; its own ``.venv``) under ``valgrind --tool=callgrind`` with instrumentation
off. One session is made and ``W`` connects warm the front up; then it is turned on
(``callgrind_control -i on``) for ``N`` connects, one after another, each the swarm's: a
WebSocket handshake, ``initialize``, ``session/resume``, then left open; dumped to
``bench/results/callgrind-connects-<tree>.out.1``. Then as long again with nothing asked,
dumped to ``….out.2``: the front's work per second (timers, background tasks), which a run
slowed by the machine's load has more of in its connects. Printed: each total, per connect,
and per connect less the idle part (the figure to compare between trees).
``callgrind_annotate --inclusive=yes FILE`` breaks a part down by C function.

Run it on two trees (``git worktree add``) to compare a change with a revision: the same
driver, the same client, only the front differs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench import common
from bench.acp import new_sessions
from bench.fanout import CWD
from bench.swarm import Counter, Watcher
from tests.support.broker_process import READY, broker_env

START_TIMEOUT = 600.0  # a Python front under valgrind starts some 50 times slower


async def _front(tree: Path, redis_url: str, out: Path, log: Path) -> asyncio.subprocess.Process:
    python = tree / ".venv" / "bin" / "python"
    args = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        str(python),
        "-m",
        "broker.cli",
        *common.front_args(redis_url),
    ]
    env = broker_env(None, common.BENCH_ENV)
    env["PYTHONPATH"] = str(tree)
    env["PYTHONHASHSEED"] = "0"  # the same dict and set layouts in every run
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as log_file:  # noqa: ASYNC230 - opened once
        return await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            env=env,
            cwd=str(tree),
            start_new_session=True,
        )


async def _ready_url(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    while True:
        raw = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
        if not raw:
            raise RuntimeError(f"the front exited ({await proc.wait()}) before it was ready")
        match = READY.search(raw.decode(errors="replace"))
        if match:
            return match[1]


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def total_instructions(out: Path) -> int:
    """The ``totals:`` line of a callgrind output file (its ``summary:`` line, written when
    the run began, says 0 when instrumentation was off then)."""
    text = out.read_text()
    match = re.search(r"^totals:\s+(\d+)", text, re.M)
    if match is None:
        raise RuntimeError(f"no totals in {out}")
    return int(match[1])


async def _connects(url: str, room: str, n: int, watchers: list[Watcher]) -> None:
    for _ in range(n):
        watcher = Watcher("broker", Counter())
        await watcher.join(url, room, CWD)
        watchers.append(watcher)


async def run(tree: Path, connects: int, warmup: int) -> tuple[int, int]:
    """Instructions the front ran during the connects, and during as long a time after them
    with nothing asked (its timers, its background tasks: work per second, not per connect,
    which a slower run of the same connects has more of)."""
    name = tree.name
    out = common.RESULTS / f"callgrind-connects-{name}.out"
    for old in common.RESULTS.glob(f"{out.name}*"):
        old.unlink()
    watchers: list[Watcher] = []
    with common.private_redis() as redis_url:
        async with common.agent_host(redis_url, f"cg-{name}"):
            proc = await _front(tree, redis_url, out, common.LOGS / f"cg-{name}-front.log")
            try:
                url = await _ready_url(proc)
                drain = asyncio.create_task(proc.stdout.read())  # type: ignore[union-attr]
                room = (await new_sessions(url, 1, CWD))[0]
                await _connects(url, room, warmup, watchers)
                _control(proc.pid, "-i", "on")
                start = time.monotonic()
                await _connects(url, room, connects, watchers)
                took = time.monotonic() - start
                _control(proc.pid, "-d")  # the connects: OUT.1
                await asyncio.sleep(took)
                _control(proc.pid, "-d")  # as long with nothing asked: OUT.2
                _control(proc.pid, "-i", "off")
            finally:
                for watcher in watchers:
                    if watcher.client is not None:
                        watcher.client.close()
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, 15)
                    try:
                        await asyncio.wait_for(proc.wait(), 300)
                    except TimeoutError:
                        os.killpg(proc.pid, 9)
                        await proc.wait()
            drain.cancel()
    return total_instructions(Path(f"{out}.1")), total_instructions(Path(f"{out}.2"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.callgrind_connects", description=__doc__)
    p.add_argument("--tree", type=Path, default=common.ROOT, help="the tree whose front runs")
    p.add_argument("--connects", type=int, default=300, help="connects counted (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="connects before counting")
    args = p.parse_args(argv)
    tree = args.tree.resolve()
    total, idle = asyncio.run(run(tree, args.connects, args.warmup))
    print(
        f"{tree}: {total:,} instructions for {args.connects} connects, "
        f"{total / args.connects:,.0f} per connect; {idle:,} in as long idle after; "
        f"{(total - idle) / args.connects:,.0f} per connect less that"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
