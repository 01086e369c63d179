"""The web console in headless Chromium: a 10,000-event session, a 100,000-session list.

* **session**: a page opens ``/#session=ID&cwd=DIR`` (the list's link) of a session whose
  log holds 10,000 events (200 turns: the prompt, 48 Markdown chunks, the end), from a
  fresh browser context (cold cache). Time from navigation start until the last turn's
  reply is rendered and the page says idle: the page loads, connects, resumes with the
  whole replay and lays it out.
* **list**: a page opens ``/`` with 100,000 sessions in the tenant's index. Time from
  navigation start until the first page of the list (50 rows) is shown.

Targets: under 1.5 s and under 0.5 s. One front node (``serve --no-workers``), an agent
host and a projector on a private redis-server; Debian's Chromium (``/usr/bin/chromium``)
over the DevTools protocol (:mod:`bench.cdp`: no Playwright, whose network instrumentation
copies every WebSocket frame out of the page and would be what is timed).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any
from urllib.parse import urlencode

from bench import common
from bench.acp import new_sessions

CWD = "/srv/bench"
TENANT = "default"
TURNS = 200
CHUNKS = 48  # a turn is 1 + CHUNKS + 1 events
SESSIONS = 100_000
TARGETS = {"session": 1.5, "list": 0.5}

# The page's own clock: navigation start to the moment the condition first holds (polled
# every animation frame, so the time includes layout of what is shown).


def session_done(turns: int) -> str:
    """True (the time) once all ``turns`` replies are rendered and the page says idle."""
    return f"""() => {{
        const replies = document.querySelectorAll('#transcript article.agent');
        const last = replies[replies.length - 1];
        return replies.length === {turns} && last.textContent.includes('end of turn {turns - 1}')
            && document.getElementById('session-state').textContent === 'idle'
            && performance.now();
    }}"""


VERBOSE = False
MARKS = """() => [
    ...performance.getEntriesByType('navigation').map(e => ['html', e.responseEnd]),
    ...performance.getEntriesByType('resource').map(e => [e.name.split('/').pop(), e.responseEnd]),
    ...performance.getEntriesByType('mark').map(e => [e.name, e.startTime]),
].map(([name, at]) => `${name} ${Math.round(at)}`).join(', ')"""
LIST_SHOWN = """() => document.querySelectorAll('#sessions li').length >= 50 && performance.now()"""


async def fill(url: str, session: str, turns: int) -> None:
    """The session's log: ``turns`` turns of a prompt, CHUNKS reply chunks and the end."""
    from broker.store.client import connect
    from broker.store.log import SessionLog

    store = connect(url)
    log = SessionLog(store)
    for turn in range(turns):
        events: list[dict[str, Any]] = [
            {
                "type": "prompt",
                "promptId": f"bench-{turn}",
                "prompt": [{"type": "text", "text": f"question {turn}"}],
            }
        ]
        for j in range(CHUNKS):
            text = f"word {j} " if j % 12 else f"\n\n**part {j // 12}** of `turn {turn}`: "
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            }
            events.append({"type": "update", "update": update})
        events[-1]["update"]["content"]["text"] = f"end of turn {turn}"
        events.append({"type": "prompt_end", "stopReason": "end_turn"})
        for event in events:  # one after another: a turn's events are in order
            await log.append(TENANT, session, event)
    await store.aclose()


def _http_port(lines: list[str]) -> int:
    match = re.search(r"and http://[^:]+:(\d+)", "".join(lines))
    if not match:
        raise RuntimeError(f"no HTTP port in {lines!r}")
    return int(match[1])


async def timed(browser: Any, url: str, condition: str, timeout_s: float) -> float:
    """Seconds from navigation start until ``condition`` returns a time, in a cold context."""
    took = float(await browser.time_until(url, condition, timeout_s)) / 1000
    if VERBOSE:
        marks = await browser.time_until(url, f"() => ({condition})() && ({MARKS})()", timeout_s)
        print(f"    again, its timeline: {marks}", flush=True)
    return took


async def run_once(
    rounds: int, turns: int, sessions: int, baselines: list[str], timeout_s: float
) -> dict[str, dict[str, list[float]]]:
    """Seconds per system (this tree, then each baseline) and page; the systems' loads take
    turns in each round, on the same Redis, agent host and projector."""
    from bench.cdp import chromium
    from bench.listing import populate_redis

    systems = ["this tree", *(f"at {rev}" for rev in baselines)]
    times: dict[str, dict[str, list[float]]] = {
        name: {"session": [], "list": []} for name in systems
    }
    with common.private_redis() as url:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(common.agent_host(url, "console"))
            log = common.LOGS / "console-projector.log"
            await stack.enter_async_context(common.role_process("projector", url, log))
            nodes = await stack.enter_async_context(common.fronts(url, 1, "console"))
            bases = [f"http://127.0.0.1:{_http_port(nodes[0].stdout_lines)}/"]
            for rev in baselines:
                lines: list[str] = []
                tree = common.baseline_tree(rev)
                await stack.enter_async_context(
                    common.fronts_at(tree, url, 1, f"console-{rev}", ready_lines=lines)
                )
                bases.append(f"http://127.0.0.1:{_http_port(lines)}/")
            browser = await stack.enter_async_context(chromium())
            (session,) = await new_sessions(nodes[0].url, 1, CWD)
            await fill(url, session, turns)
            await populate_redis(url, sessions)
            link = f"#{urlencode({'session': session, 'cwd': CWD})}"
            for r in range(rounds + 1):  # the first round warms up
                for name, base in zip(systems, bases, strict=True):
                    session_s = await timed(browser, base + link, session_done(turns), timeout_s)
                    list_s = await timed(browser, base, LIST_SHOWN, timeout_s)
                    print(
                        f"  round {r}, {name}: session {session_s:.3f} s, list {list_s:.3f} s",
                        flush=True,
                    )
                    if r:
                        times[name]["session"].append(session_s)
                        times[name]["list"].append(list_s)
    return times


async def run(args: Any) -> None:
    from tests.support.browser import chromium_missing

    if (missing := chromium_missing()) is not None:
        raise SystemExit(f"bench console: {missing}")
    global VERBOSE
    VERBOSE = args.verbose
    rounds = args.rounds or (1 if args.quick else 5)
    sessions = 1_000 if args.quick else SESSIONS
    turns = 20 if args.quick else TURNS
    events = turns * (CHUNKS + 2)
    times: dict[str, dict[str, list[float]]] = {}
    for r in range(args.runs):
        print(f"console: {events:,} events, {sessions:,} sessions (run {r + 1})")
        got = await run_once(rounds, turns, sessions, args.baseline, 30.0)
        for system, pages in got.items():
            common.extend_each(times.setdefault(system, {}), pages)
    labels = {
        "session": f"{events:,}-event session, fully rendered",
        "list": f"first page of a {sessions:,}-session list",
    }
    ours = times["this tree"]
    rows = []
    for name in ("session", "list"):
        row = [labels[name], common.median(ours[name]), max(ours[name])]
        for system in list(times)[1:]:
            base = common.median(times[system][name])
            row += [base, common.ratio(common.median(ours[name]), base)]
        met = "yes" if common.median(ours[name]) < TARGETS[name] else "no"
        rows.append([*row, TARGETS[name], met])
    head = ["page", "median s", "max s"]
    for system in list(times)[1:]:
        head += [f"{system} s", "ratio"]
    text = common.table(
        f"Web console in headless Chromium, seconds, median of {len(ours['session'])} cold loads",
        [*head, "target s", "met"],
        rows,
    )
    data = {"quick": args.quick, "sessions": sessions, "events": events}
    common.report("console", [text], {**data, "seconds": times}, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("console", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--verbose", action="store_true", help="print each load's timeline")
    p.add_argument("--rounds", type=int, default=0, help="cold loads of each page per run")
    common.add_baseline(p)
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
