"""Profiles of server processes under a benchmark's load (py-spy, collapsed stacks).

``python -m bench.profile FILE.txt [N]`` prints the functions with the most samples, self
and inclusive: what a benchmark's ``--profile`` recorded (``bench/results/profile-*.txt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path


@contextlib.asynccontextmanager
async def recording(
    pid: int, out: Path, rate: int = 1000, *, gil: bool = False
) -> AsyncIterator[None]:
    """py-spy records ``pid`` while the block runs (nothing if py-spy is not installed).

    ``gil``: only samples that hold the GIL (what costs CPU; a loop waiting in ``epoll``
    would otherwise fill the profile)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():  # noqa: ASYNC240 - once, before the load
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        exe,
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(rate),
        "--format",
        "raw",
        "--output",
        str(out),
        "--nonblocking",
        *(["--gil"] if gil else []),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(0.5)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def collapsed_stacks(text: str) -> Iterator[tuple[str, int]]:
    """Each ``(stack, samples)`` of py-spy's raw (collapsed) output: a stack a line, its
    count last. A frame's name may hold a newline (a function's name made by ``exec``, a
    lambda's source), so a line that does not end in a count goes on into the next."""
    pending = ""
    for line in text.splitlines():
        stack, _, count = (pending + line).rpartition(" ")
        if not (stack and count.isdigit()):
            pending += line + "\n"
            continue
        pending = ""
        yield stack, int(count)


def summarize(path: Path, top: int = 30) -> str:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for stack, n in collapsed_stacks(path.read_text()):
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
            for f in stack.split(";")
        ]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{path.name}: {total} samples", "", "self %  function"]
    for name, n in own.most_common(top):
        lines.append(f"{100 * n / total:5.1f}  {name}")
    lines += ["", "incl %  function"]
    for name, n in inclusive.most_common(top):
        lines.append(f"{100 * n / total:5.1f}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 30))
