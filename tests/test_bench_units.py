"""The benchmarks' pure helpers, without a benchmark run."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from bench.common import commands, extend_each, in_turn
from bench.profile import collapsed_stacks, summarize


def test_collapsed_stacks_join_a_frame_name_split_by_a_newline() -> None:
    text = (
        "main (a.py:1);loop (b.py:2) 5\n"
        "main (a.py:1);<lambda: x\ny> (c.py:3) 2\n"  # a frame name holding a newline
        "main (a.py:1) 1\n"
    )
    assert list(collapsed_stacks(text)) == [
        ("main (a.py:1);loop (b.py:2)", 5),
        ("main (a.py:1);<lambda: x\ny> (c.py:3)", 2),
        ("main (a.py:1)", 1),
    ]


def test_summarize_counts_self_and_inclusive_samples(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text("main (/x/a.py:1);loop (/x/b.py:2) 3\nmain (/x/a.py:1) 1\n")
    summary = summarize(raw)
    assert summary.startswith("profile.txt: 4 samples")
    assert " 75.0  loop (b.py)" in summary and "100.0  main (a.py)" in summary


def test_in_turn_puts_each_system_first_in_turn() -> None:
    systems = ("a", "b", "c")
    assert [in_turn(systems, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_extend_each_adds_a_run_to_the_runs_before() -> None:
    rates: dict[str, list[float]] = {"a": [1.0]}
    extend_each(rates, {"a": [2.0], "b": [3.0, 4.0]})
    assert rates == {"a": [1.0, 2.0], "b": [3.0, 4.0]}


async def test_commands_are_the_stripped_lines_then_an_empty_one_at_the_end() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"count\n  check {}  \nquit\n")
    os.close(write_end)
    got = []
    with os.fdopen(read_end, "rb") as pipe:
        async with contextlib.aclosing(commands(5.0, pipe)) as lines:
            async for command in lines:
                got.append(command)
                if not command:
                    break
    assert got == ["count", "check {}", "quit", ""]


async def test_commands_end_when_their_lifetime_has_passed() -> None:
    read_end, write_end = os.pipe()
    started = time.monotonic()
    with os.fdopen(read_end, "rb") as pipe:
        assert [command async for command in commands(0.2, pipe)] == []
    os.close(write_end)
    assert 0.2 <= time.monotonic() - started < 5.0
