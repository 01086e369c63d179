"""What every benchmark shares: processes, CPU and memory readings, percentiles, output.

Every benchmark runs real processes over loopback only (a private redis-server, broker
nodes, peers, client swarms), bounds every loop in count and time, prints a table and
writes ``bench/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar, cast

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
LOGS = RESULTS / "logs"

if str(ROOT) not in sys.path:  # tests.support is reused, not duplicated
    sys.path.insert(0, str(ROOT))

from tests.support.broker_process import BrokerProcess, broker_env, broker_process  # noqa: E402
from tests.support.redis_server import free_port, port_of, redis_server  # noqa: E402
from tests.support.roles import RoleProcess, role_process  # noqa: E402

__all__ = [
    "LOGS",
    "ROOT",
    "BrokerProcess",
    "RoleProcess",
    "broker_env",
    "broker_process",
    "free_port",
    "redis_server",
    "role_process",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CURSOR_SECRET = "bench-secret"
BENCH_ENV = {
    # The benchmarks measure the data path, not the admission limits: 10,000 connections
    # and thousands of requests a second on one connection are what they send on purpose.
    "ACP_BROKER_MAX_CONNECTIONS": "1000000",
    "ACP_BROKER_RATE_PER_CONNECTION": "1000000",
    "ACP_BROKER_RATE_PER_TOKEN": "1000000",
    "ACP_BROKER_MAX_SESSIONS_PER_CONNECTION": "1000000",
    # The test harness keeps the caller's ACP_BROKER_* out of its processes; this one goes
    # through, so that one variable sets the loop of every server in a run.
    "ACP_BROKER_EVENT_LOOP": os.environ.get("ACP_BROKER_EVENT_LOOP", "auto"),
}


# -- arguments ---------------------------------------------------------------------------------


def parser(name: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m bench {name}", description=description)
    p.add_argument("--quick", action="store_true", help="small sizes (< 1 minute), for smoke tests")
    p.add_argument("--runs", type=int, default=1, help="repeat and report the median of each cell")
    p.add_argument("--out", type=Path, default=None, help="JSON output (default bench/results/)")
    return p


def run_server(main: Coroutine[Any, Any, None]) -> None:
    """Run a peer's or a ceiling's server process on the event loop the broker's fronts
    run on (``ACP_BROKER_EVENT_LOOP``, default ``auto``: uvloop where installed), so that
    servers are compared, not event loops."""
    from broker import loops

    loops.run(main, event_loop())


def event_loop() -> Literal["asyncio", "uvloop"]:
    """The event loop the benchmark's servers run on (``ACP_BROKER_EVENT_LOOP``, default
    ``auto``), as it resolves here: ``asyncio`` or ``uvloop``."""
    from broker import loops

    choice = os.environ.get("ACP_BROKER_EVENT_LOOP", "auto")
    if choice not in ("auto", "uvloop", "asyncio"):
        raise SystemExit(f"ACP_BROKER_EVENT_LOOP={choice!r}: auto, asyncio or uvloop")
    return loops.resolve(cast(loops.LoopChoice, choice))


def add_baseline(p: argparse.ArgumentParser) -> None:
    """``--baseline REV``: also run the broker's fronts as of a git revision, side by side."""
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="REV",
        help="also run the broker's fronts as of git revision REV, side by side (before/after)",
    )


# -- readings ----------------------------------------------------------------------------------


def proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command's name (``fields[0]`` is the
    state, field 3 of proc(5))."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process so far, seconds (``/proc/<pid>/stat``)."""
    fields = proc_stat(pid)
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # utime, stime (fields 14, 15)


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process so far."""
    return sum(cpu_times(pid))


def cpu_of(pids: Sequence[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


@dataclass(frozen=True)
class MachineCpu:
    """CPU seconds the whole machine spent busy, and those of processes not of this run."""

    busy: float
    others: float

    def __sub__(self, other: MachineCpu) -> MachineCpu:
        return MachineCpu(self.busy - other.busy, self.others - other.others)

    def __add__(self, other: MachineCpu) -> MachineCpu:
        return MachineCpu(self.busy + other.busy, self.others + other.others)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """This process's cyclic garbage collector off for the block, one collection after it.

    The bench process feeds every system; its heap (imports, peers' clients, every report
    so far) makes a full collection take 40-70 ms here, and one that fell between a
    stamp and its send would count as that system's latency, whichever it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
            gc.collect()


def machine_cpu() -> MachineCpu:
    """The machine's busy CPU seconds so far (``/proc/stat``: all but idle and iowait), and
    how much of it went to processes outside this one's tree (its children and theirs):
    what other work on a shared machine took while a run was measured."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    busy = (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK
    return MachineCpu(busy, busy - _tree_cpu(os.getpid()))


def _tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its descendants that are alive (and of their reaped
    children: ``cutime``/``cstime``)."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = proc_stat(int(entry))
        except OSError:  # the process ended meanwhile: none of ours are ending mid-run
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        cpu[pid] = sum(int(x) for x in fields[11:15]) / CLK_TCK
    total = 0.0
    for pid, seconds in cpu.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += seconds
    return total


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (``/proc/<pid>/statm``)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE_SIZE


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100), nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def latency_summary(values_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values_ms)
    return {
        "p50": percentile(ordered, 50),
        "p99": percentile(ordered, 99),
        "p999": percentile(ordered, 99.9),
        "n": len(ordered),
    }


def median(values: Sequence[float]) -> float:
    good = [v for v in values if v == v]  # drop NaN
    return statistics.median(good) if good else float("nan")


def ratio(a: float, b: float) -> float:
    """a ÷ b, NaN where b is zero (a run too short for the CPU clock's 10 ms ticks)."""
    return a / b if b else float("nan")


T = TypeVar("T")


def in_turn(systems: Sequence[T], r: int) -> list[T]:
    """``systems`` in round ``r``'s order: each goes first in turn, so the machine's drift
    over a run hits every system alike."""
    turn = r % len(systems)
    return [*systems[turn:], *systems[:turn]]


def extend_each(into: dict[str, list[float]], got: Mapping[str, Sequence[float]]) -> None:
    """Adds one run's values of each name to the values ``into`` holds of that name."""
    for name, values in got.items():
        into.setdefault(name, []).extend(values)


async def commands(
    lifetime: float, pipe: IO[Any] | None = None, limit: int = 1 << 16
) -> AsyncGenerator[str, None]:
    """The lines a child's driver writes to its stdin (or ``pipe``), stripped, until
    ``lifetime`` seconds have passed; an empty one at the end of the input. ``limit``: the
    longest line."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin if pipe is None else pipe
    )
    deadline = time.monotonic() + lifetime
    try:
        while time.monotonic() < deadline:
            try:
                line = await asyncio.wait_for(reader.readline(), deadline - time.monotonic())
            except TimeoutError:
                return
            yield line.decode().strip()
    finally:
        transport.close()


def raise_nofile(want: int = 65536) -> int:
    """Raise this process's open-file limit as far as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(want, hard) if hard != resource.RLIM_INFINITY else want
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Deadline:
    """A bound in time for a loop."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def __bool__(self) -> bool:  # true while time is left
        return time.monotonic() < self.end


# -- output ------------------------------------------------------------------------------------


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None else str(value)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (it reads in a terminal and pastes into docs/performance.md)."""
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [f"### {title}", ""]
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    lines.append("| " + " | ".join("-" * w for w in widths) + " |")
    for row in cells:
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "event_loop": event_loop(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(name: str, data: dict[str, Any], out: Path | None = None) -> Path:
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **data}, indent=2))
    return path


def report(name: str, tables: Sequence[str], data: dict[str, Any], out: Path | None) -> None:
    for text in tables:
        print(text, flush=True)
        print(flush=True)
    path = write_json(name, data, out)
    print(f"results: {path}", flush=True)


# -- processes ---------------------------------------------------------------------------------


@contextlib.contextmanager
def private_redis(*extra: str) -> Iterator[str]:
    """A private redis-server (tests/support/redis_server.py), no persistence."""
    with redis_server(*extra) as url:
        yield url


@contextlib.contextmanager
def private_store(cluster: bool) -> Iterator[tuple[str, list[int]]]:
    """A private store's URL and its masters' ports: one server (:func:`private_redis`), or
    a 3-master Redis Cluster."""
    if cluster:
        from tests.support.redis_cluster import redis_cluster

        with redis_cluster() as info:
            yield info.url, info.masters()
    else:
        with private_redis() as url:
            yield url, [port_of(url)]


@contextlib.contextmanager
def replica_of(url: str) -> Iterator[str]:
    """A private redis-server replicating ``url``'s, once it is in sync."""
    import redis

    port = url.rsplit(":", 1)[1].split("/")[0]
    with redis_server("--replicaof", "127.0.0.1", port) as replica:
        with redis.Redis.from_url(url) as master:
            deadline = time.monotonic() + 30
            while master.info("replication").get("slave0", {}).get("state") != "online":
                if time.monotonic() > deadline:
                    raise TimeoutError("the replica did not come online")
                time.sleep(0.05)
        yield replica


def redis_pid(url: str) -> int | None:
    import redis

    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


@contextlib.asynccontextmanager
async def fronts(
    redis_url: str, count: int, tag: str, *, env: dict[str, str] | None = None
) -> AsyncIterator[list[BrokerProcess]]:
    """``count`` front nodes (``serve --no-workers``) on free ports."""
    async with contextlib.AsyncExitStack() as stack:
        nodes = []
        for i in range(count):
            node = await stack.enter_async_context(
                broker_process(
                    redis_url,
                    log_path=LOGS / f"{tag}-front{i}.log",
                    cursor_secret=CURSOR_SECRET,
                    extra_args=["--no-workers"],
                    env={**BENCH_ENV, **(env or {})},
                )
            )
            nodes.append(node)
        yield nodes


def baseline_tree(rev: str) -> Path:
    """A checkout of ``rev`` (a git worktree in /tmp) to run the broker as it was there."""
    import subprocess

    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = Path(f"/tmp/acpb-bench-base-{sha}")
    if not tree.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), sha],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    return tree


def front_args(redis_url: str) -> list[str]:
    """The command-line arguments of a benchmark's bare front (after ``broker.cli``): serve
    on a free loopback port, on ``redis_url``, with no workers beside it."""
    return [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--redis-url",
        redis_url,
        "--cursor-secret",
        CURSOR_SECRET,
        "--no-workers",
    ]


@contextlib.asynccontextmanager
async def fronts_at(
    tree: Path,
    redis_url: str,
    count: int,
    tag: str,
    *,
    ready_lines: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[list[tuple[str, int]]]:
    """``count`` front nodes running the code of ``tree`` (see :func:`baseline_tree`);
    yields (url, pid) pairs. ``ready_lines`` gets each node's start-up line (it names the
    HTTP port too); ``env``: more of their environment, as :func:`fronts` takes."""
    from tests.support.broker_process import READY

    code = (
        f"import sys; sys.path.insert(0, {str(tree)!r}); "
        "from broker.cli import main; sys.exit(main())"
    )
    procs: list[asyncio.subprocess.Process] = []
    drains: list[asyncio.Task[None]] = []
    try:
        nodes = []
        for i in range(count):
            LOGS.mkdir(parents=True, exist_ok=True)
            with open(LOGS / f"{tag}-base{i}.log", "ab") as log_file:  # noqa: ASYNC230
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    code,
                    *front_args(redis_url),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log_file,
                    env={**broker_env(), **BENCH_ENV, **(env or {}), "PYTHONPATH": str(tree)},
                    cwd=str(tree),
                    start_new_session=True,
                )
            procs.append(proc)
            assert proc.stdout is not None
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), 30)
                if not line:
                    raise RuntimeError(f"baseline front exited; see {LOGS / f'{tag}-base{i}.log'}")
                match = READY.search(line.decode())
                if match:
                    nodes.append((match[1], proc.pid))
                    if ready_lines is not None:
                        ready_lines.append(line.decode())
                    break
            drains.append(asyncio.create_task(_drain_lines(proc.stdout)))
        yield nodes
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for task in drains:
            task.cancel()


async def _drain_lines(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


@contextlib.asynccontextmanager
async def agent_host(redis_url: str, tag: str) -> AsyncIterator[RoleProcess]:
    log = LOGS / f"{tag}-agent-host.log"
    async with role_process("agent-host", redis_url, log, env=BENCH_ENV) as host:
        yield host


class Child:
    """A helper process of ours (peer server, relay, swarm) speaking lines on stdio."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def line(self, timeout: float = 60.0) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError(f"{self.name} exited ({await self.proc.wait()}); see its log")
        return raw.decode().strip()

    async def expect(self, prefix: str, timeout: float = 60.0) -> str:
        while True:
            text = await self.line(timeout)
            if text.startswith(prefix):
                return text[len(prefix) :].strip()

    async def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    async def stop(self, grace: float = 5.0) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()


@contextlib.asynccontextmanager
async def child(module: str, *args: str, name: str | None = None) -> AsyncIterator[Child]:
    """``python -m <module> args…`` with line-based stdio; stderr to bench/results/logs."""
    name = name or module.rsplit(".", 1)[-1]
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / f"{name}.log", "ab") as log_file:  # noqa: ASYNC230 - opened once
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            env=broker_env(),
            cwd=str(ROOT),
            start_new_session=True,
            limit=1 << 30,  # a swarm's report is one long line
        )
    node = Child(proc, name)
    try:
        yield node
    finally:
        await node.stop()
