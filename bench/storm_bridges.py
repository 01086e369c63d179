"""Bridges storm: every editor's stdio bridge resumes after its front dies mid-turn.

An agent host (the demo agent) and one front (``serve --no-workers``) on a fixed address,
on a private Redis. B editors (this process) each run ``acp-broker connect URL`` as their
agent, open a session and send ``/slow N`` (N chunks 0.2 s apart). Once every turn has
streamed a few chunks, the front is sent SIGTERM (close 1001 to every connection) or
SIGKILL (no close frame), and a replacement front starts on the same address at once.

Reported, per way of stopping: how long the replacement took to be ready (the floor: no
update can come before it), from the signal to the next update reaching each editor (p50,
max; the replacement's start-up is inside it), and whether every editor got each of
its turn's N chunks exactly once, in order, and its prompt request the turn's real end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from bench import common
from tests.support.broker_process import BrokerStartError

CHUNKS = 40
"""Chunks per turn (8 s of streaming at the demo agent's 0.2 s)."""
START_TIMEOUT = 60.0


class Editor:
    """A stand-in editor: the bridge as its agent process, JSON-RPC lines on its stdio."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.chunks: list[tuple[float, str]] = []
        self.streaming = asyncio.Event()
        """Set once its turn has streamed a few chunks."""
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = 0
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, url: str) -> Editor:
        env = {**os.environ, "PYTHONPATH": str(common.ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "broker.cli",
            "connect",
            url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )
        return cls(proc)

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._ids += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[self._ids] = future
        message = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()
        return await future

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            message = json.loads(line)
            if message.get("method") == "session/update":
                update = message["params"]["update"]
                if update.get("sessionUpdate") == "agent_message_chunk":
                    self.chunks.append((time.monotonic(), update["content"].get("text", "")))
                    if len(self.chunks) >= 3:
                        self.streaming.set()
            elif "method" not in message and message.get("id") in self._replies:
                self._replies.pop(message["id"]).set_result(message)

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 10)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()


@contextlib.asynccontextmanager
async def _front(redis_url: str, port: int, tag: str) -> AsyncIterator[Any]:
    args = ["--no-workers", "--port", str(port), "--http-port", "0"]
    async with common.broker_process(
        redis_url,
        log_path=common.LOGS / f"{tag}.log",
        cursor_secret=common.CURSOR_SECRET,
        extra_args=args,
        env=common.BENCH_ENV,
        start_timeout=START_TIMEOUT,
    ) as node:
        yield node


async def run_case(stop: str, bridges: int, tag: str) -> dict[str, Any]:
    """One storm: ``bridges`` editors mid-turn, their front stopped by ``stop``."""
    sig = signal.SIGTERM if stop == "sigterm" else signal.SIGKILL
    with common.private_redis() as redis_url:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(common.agent_host(redis_url, tag))
            port = common.free_port()
            url = f"ws://127.0.0.1:{port}/acp"
            front = await stack.enter_async_context(_front(redis_url, port, f"{tag}-front1"))
            editors = [await Editor.start(url) for _ in range(bridges)]
            caps = {"protocolVersion": 1, "clientCapabilities": {}}
            await asyncio.gather(*(e.call("initialize", caps) for e in editors))
            news = await asyncio.gather(
                *(e.call("session/new", {"cwd": "/storm", "mcpServers": []}) for e in editors)
            )
            prompts = [
                asyncio.ensure_future(
                    e.call(
                        "session/prompt",
                        {
                            "sessionId": n["result"]["sessionId"],
                            "prompt": [{"type": "text", "text": f"/slow {CHUNKS}"}],
                        },
                    )
                )
                for e, n in zip(editors, news, strict=True)
            ]
            await asyncio.wait_for(asyncio.gather(*(e.streaming.wait() for e in editors)), 60)
            stopped_at = time.monotonic()
            os.kill(front.pid, sig)
            reaped = asyncio.ensure_future(front.terminate())  # reaps it (SIGTERM: drains)
            await stack.enter_async_context(_replacement(redis_url, port, f"{tag}-front2"))
            ready_s = time.monotonic() - stopped_at  # the floor: no update before it
            await reaped
            replies = await asyncio.wait_for(asyncio.gather(*prompts), 120)
            await asyncio.gather(*(e.close() for e in editors))
    gaps = [_next_after(e, stopped_at) for e in editors]
    want = [f"chunk {i}" for i in range(1, CHUNKS + 1)]
    exact = sum([text for _, text in e.chunks] == want for e in editors)
    ended = sum(r.get("result", {}).get("stopReason") == "end_turn" for r in replies)
    return {
        "stop": stop,
        "bridges": bridges,
        "replacement_ready_s": ready_s,
        "next_update_p50_s": common.percentile(gaps, 50),
        "next_update_max_s": max(gaps),
        "after_replacement_max_s": max(gaps) - ready_s,
        "exactly_once_in_order": exact,
        "prompt_real_end": ended,
    }


@contextlib.asynccontextmanager
async def _replacement(redis_url: str, port: int, tag: str) -> AsyncIterator[Any]:
    """A replacement front on the same address, started as soon as the port is free."""
    deadline = common.Deadline(30)
    while True:
        try:
            async with _front(redis_url, port, tag) as node:
                yield node
                return
        except BrokerStartError:
            if not deadline:
                raise
            await asyncio.sleep(0.05)


def _next_after(editor: Editor, at: float) -> float:
    later = [t for t, _ in editor.chunks if t > at]
    return (min(later) - at) if later else float("nan")


async def run(args: Any) -> None:
    bridges = args.bridges
    cells = []
    for stop in ("sigterm", "sigkill"):
        print(f"storm (bridges): {bridges} bridges, front stopped by {stop}", flush=True)
        cell = await run_case(stop, bridges, f"storm-bridges-{stop}")
        print(f"  {json.dumps(cell)}", flush=True)
        cells.append(cell)
    text = common.table(
        f"Bridges storm: {bridges} editors mid-turn through acp-broker connect, their front "
        "stopped, a replacement on the same address",
        [
            "stop",
            "bridges",
            "replacement up s",
            "next update p50 s",
            "max s (<5)",
            "max after up s",
            "once",
            "ended",
        ],
        [
            [
                c["stop"],
                c["bridges"],
                c["replacement_ready_s"],
                c["next_update_p50_s"],
                c["next_update_max_s"],
                c["after_replacement_max_s"],
                c["exactly_once_in_order"],
                c["prompt_real_end"],
            ]
            for c in cells
        ],
    )
    common.report("storm-bridges", [text], {"quick": args.quick, "runs": cells}, args.out)
