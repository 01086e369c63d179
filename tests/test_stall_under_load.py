"""A stalled Redis under load: every request is answered fast once the store is known away.

A real ``acp-broker serve`` on a redis-server that the test stops with SIGSTOP for 30 s
while 10 clients each send 20 ``session/list`` a second, and one of them a ``session/new``
every 2 s. Every request sent once the broker's probe has noticed the stall is answered
within 2 s (p99; with the store's "try again" error, or from the front's page cache), none
is left unanswered, and once Redis answers again (SIGCONT) a new session takes a prompt
within 10 s. (One request at a time from one client, as ``tests/test_fail_fast.py`` sends
them, never saw requests queue behind the stall.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker.store.breaker import INTERVAL, PROBE_TIMEOUT

from .support.broker_process import broker_process
from .support.client import REPLY_WAIT, RawClient, text, wait_for
from .support.redis_server import restartable_redis

pytestmark = pytest.mark.slow

CLIENTS = 10
LISTS_PER_SECOND = 20
NEW_EVERY = 2.0
"""Seconds between two ``session/new`` of the first client."""
STALL = 30.0
KNOWN_AWAY = 2 * PROBE_TIMEOUT + INTERVAL + 1.5
"""Seconds into the stall by which the probe has noticed it (two unanswered probes, the
interval between, a loaded machine's slack)."""
ANSWERED_WITHIN = 2.0
"""p99 of the answer time of a request sent once the store is known away."""
BACK_WITHIN = 10.0
"""Seconds after SIGCONT within which a new session takes a prompt."""


@dataclass
class Traffic:
    """One client's requests: when each was sent, when (and how) each was answered."""

    client: RawClient
    sent: dict[int, tuple[float, str]] = field(default_factory=dict)
    answered: dict[int, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    next_id: int = 1

    async def send(self, method: str, params: dict[str, Any]) -> None:
        msg_id = self.next_id
        self.next_id += 1
        self.sent[msg_id] = (time.monotonic(), method)
        await self.client.ws.send(
            f'{{"jsonrpc":"2.0","id":{msg_id},"method":"{method}","params":'
            + ("{}" if not params else _json(params))
            + "}"
        )

    async def read(self) -> None:
        async for raw in self.client.ws:
            now = time.monotonic()
            message = _loads(raw)
            if isinstance(message.get("id"), int) and "method" not in message:
                self.answered[message["id"]] = (now, message)


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def _loads(raw: str | bytes) -> dict[str, Any]:
    import json

    found = json.loads(raw)
    return found if isinstance(found, dict) else {}


async def _lists(traffic: Traffic, until: float) -> None:
    """``session/list`` at :data:`LISTS_PER_SECOND` until ``until`` (a monotonic time)."""
    period = 1 / LISTS_PER_SECOND
    next_at = time.monotonic()
    while next_at < until:
        # Every other one is a page no front holds (a filter of its own): it needs the store.
        fresh = traffic.next_id % 2 == 0
        await traffic.send("session/list", {"cwd": f"/c{traffic.next_id}"} if fresh else {})
        next_at += period
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))  # the load's pace


async def _news(traffic: Traffic, until: float) -> None:
    while time.monotonic() < until:
        await traffic.send("session/new", {"cwd": "/stall", "mcpServers": []})
        await asyncio.sleep(NEW_EVERY)  # the load's pace


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def test_a_stall_under_load_fails_every_request_fast_and_new_work_runs_after_it(
    tmp_path: Path,
) -> None:
    with restartable_redis(aof=False) as redis:
        async with broker_process(redis.url, log_path=tmp_path / "broker.log") as node:
            clients = [await RawClient.initialized(node.url) for _ in range(CLIENTS)]
            first = await clients[0].call("session/new", {"cwd": "/stall", "mcpServers": []}, 30)
            assert "result" in first, first
            traffic = [Traffic(client) for client in clients]
            readers = [asyncio.ensure_future(t.read()) for t in traffic]
            try:
                start = time.monotonic()
                paused_at = start + 2.0  # the load runs 2 s before the stall
                until = paused_at + STALL
                senders = [asyncio.ensure_future(_lists(t, until)) for t in traffic]
                senders.append(asyncio.ensure_future(_news(traffic[0], until)))
                # The scenario's clock, not a wait for anything: load, then a stall of STALL s.
                await asyncio.sleep(paused_at - time.monotonic())
                redis.pause()
                try:
                    await asyncio.sleep(max(0.0, until - time.monotonic()))
                    await asyncio.gather(*senders)
                finally:
                    redis.resume()
                resumed = time.monotonic()
                # New work: a new session takes a prompt within BACK_WITHIN of SIGCONT (asked
                # again after each "try again", as a client does).
                done = await _new_work(node.url, resumed + BACK_WITHIN)
                took_back = time.monotonic() - resumed
                # Every request is answered (each within the broker's request deadline).
                await wait_for(
                    lambda: all(len(t.answered) == len(t.sent) for t in traffic),
                    REPLY_WAIT,
                    "every request answered",
                )
            finally:
                for reader in readers:
                    reader.cancel()
                for client in clients:
                    with contextlib.suppress(Exception):
                        await client.close()

    known = paused_at + KNOWN_AWAY
    late = [
        t.answered[i][0] - at
        for t in traffic
        for i, (at, _) in t.sent.items()
        if known <= at < until
    ]
    sent = sum(len(t.sent) for t in traffic)
    kinds: dict[str, int] = {}
    for t in traffic:
        for _, message in t.answered.values():
            key = "result" if "result" in message else message["error"]["message"][:60]
            kinds[key] = kinds.get(key, 0) + 1
    print(
        f"\n{sent} requests; {len(late)} sent once known away: p99 {_p99(late):.2f} s, "
        f"max {max(late):.2f} s; new session + prompt {took_back:.2f} s after SIGCONT; {kinds}"
    )
    assert sent >= CLIENTS * LISTS_PER_SECOND * STALL * 0.9
    assert _p99(late) <= ANSWERED_WITHIN, _p99(late)
    assert done.get("result", {}).get("stopReason") == "end_turn", done
    assert took_back <= BACK_WITHIN, took_back


async def _new_work(url: str, by: float) -> dict[str, Any]:
    """A new session's first prompt's reply, each step asked again after a "try again"
    until ``by`` (a monotonic time)."""
    client = await RawClient.connect(url)
    try:
        steps: list[tuple[str, Any]] = [
            ("initialize", {"protocolVersion": 1, "clientCapabilities": {}}),
            ("session/new", {"cwd": "/back", "mcpServers": []}),
        ]
        reply: dict[str, Any] = {}
        while steps:
            method, params = steps[0]
            reply = await client.call(method, params, max(by - time.monotonic(), 0.1))
            if "error" in reply:
                assert "try again" in reply["error"]["message"], reply
                assert time.monotonic() < by, reply
                await asyncio.sleep(0.1)  # a client's pause before asking again (bounded: by)
                continue
            steps.pop(0)
            if method == "session/new":
                prompt = {"sessionId": reply["result"]["sessionId"], "prompt": text("/notool")}
                steps.append(("session/prompt", prompt))
        return reply
    finally:
        await client.close()
