"""The benchmarks run: each one, ``--quick``, prints its table and writes its JSON.

Timing is not checked here (this machine is shared and noisy); the figures are in the
table in docs/performance.md, made with the full sizes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, subprocess_env

pytest.importorskip("socketio")
pytest.importorskip("aiohttp")
pytest.importorskip("asyncpg")

BENCHMARKS = (
    "fanout",
    "list",
    "append",
    "connections",
    "replay",
    "requests",
    "cluster",
    "projector",
    "console",
    "storm",
    "c50k",
    "sessionmem",
    "idle",
    "agents",
    "http",
)


async def _run(name: str, out: Path, turns: asyncio.Semaphore) -> tuple[str, int, str]:
    async with turns:
        return await _run_one(name, out)


async def _run_one(name: str, out: Path) -> tuple[str, int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench",
        name,
        "--quick",
        "--out",
        str(out),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(ROOT),
        env=subprocess_env(),
    )
    try:
        stdout, _ = await asyncio.wait_for(proc.communicate(), 150)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return name, proc.returncode or 0, stdout.decode(errors="replace")


def failure_of(output: str) -> str:
    """What a failed benchmark said: its first traceback (the servers' logs it prints
    after one can be long), else the end of its output."""
    start = output.find("Traceback (most recent call last)")
    return output[start : start + 4000] if start >= 0 else output[-3000:]


# Two at a time, each bounded by its own 150 s: the whole takes up to half that per benchmark.
@pytest.mark.timeout(75 * len(BENCHMARKS) + 60)
async def test_every_benchmark_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    # Two at a time: all of them at once are a storm on two cores that starves the other
    # pytest-xdist worker's tests (and the benchmarks' own connects) past their bounds.
    turns = asyncio.Semaphore(2)
    runs = await asyncio.gather(*(_run(n, tmp_path / f"{n}.json", turns) for n in BENCHMARKS))
    for name, code, output in runs:
        assert code == 0, f"{name} exited with {code}:\n{failure_of(output)}"
        assert "\n| " in output and " |\n" in output, f"{name} printed no table:\n{output}"
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert data["benchmark"] == name and data["quick"] is True
        if name == "list":  # the two-hop ceiling answered beside the fronts (NaN: it did not)
            assert all(cell["redis_relay"][1] > 0 for cell in data["summary"].values()), data
