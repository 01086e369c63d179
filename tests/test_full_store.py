"""A store filling up (``maxmemory 50mb``, ``noeviction``) with 400 KB prompts: a client is
told a session exists only if it does, and every refusal says ``store_full``.

Real processes on a real redis-server, as a team deploys them: two front-only nodes, an
agent host and a projector; each client makes and prompts its sessions through one front,
and loads (then closes) each through the other. The client makes sessions and sends each
a 400 KB prompt until Redis is full, then goes on for a while. Every ``session/new``
answered with a sessionId names a session that takes the next request (a prompt answered,
or refused as ``store_full``: never "session not found"); every request refused is refused
with ``data.reason`` ``store_full``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from .support.broker_process import broker_process
from .support.client import RawClient, text
from .support.redis_server import redis_server
from .support.roles import role_process

pytestmark = pytest.mark.slow

PROMPT_BYTES = 400 * 1024
ROUNDS = 100
"""Sessions tried by each client: about 125 in all fill 50 MB."""
CLIENTS = 4
"""Clients filling it side by side."""
AFTER_FULL = 15
"""Rounds tried once the store refused the first write."""


def _refusal(reply: dict[str, Any]) -> str | None:
    """The refusal's reason (None for a result); a refusal must say store_full."""
    if "result" in reply:
        return None
    error = reply["error"]
    assert (error.get("data") or {}).get("reason") == "store_full", reply
    return "store_full"


class Filler:
    """One client's rounds: a session, a 400 KB prompt to it, a small one, a load."""

    def __init__(self) -> None:
        self.made = self.refused = 0
        self.full_at: int | None = None

    def _refused(self, reply: dict[str, Any], round_: int) -> bool:
        if _refusal(reply) is None:
            return False
        self.refused += 1
        self.full_at = round_ if self.full_at is None else self.full_at
        return True

    async def run(self, url: str, other_url: str, big: str) -> None:
        client = await RawClient.initialized(url)
        other = await RawClient.initialized(other_url)  # the same client, through another front
        try:
            for round_ in range(ROUNDS):
                reply = await client.call("session/new", {"cwd": "/full", "mcpServers": []}, 40)
                if not self._refused(reply, round_):
                    self.made += 1
                    session_id = reply["result"]["sessionId"]
                    # The session exists: each request is run or refused as store_full.
                    for words in (big, "/notool hi"):
                        params = {"sessionId": session_id, "prompt": text(words)}
                        self._refused(await client.call("session/prompt", params, 40), round_)
                    load = {"sessionId": session_id, "cwd": "/full", "mcpServers": []}
                    if not self._refused(await other.call("session/load", load, 40), round_):
                        closing = {"sessionId": session_id}
                        self._refused(await other.call("session/close", closing, 40), round_)
                if self.full_at is not None and round_ - self.full_at >= AFTER_FULL:
                    return
        finally:
            await client.close()
            await other.close()


async def test_a_full_store_acknowledges_only_sessions_that_exist(tmp_path: Path) -> None:
    big = "/notool " + "x" * PROMPT_BYTES
    fillers = [Filler() for _ in range(CLIENTS)]
    with redis_server("--maxmemory", "50mb", "--maxmemory-policy", "noeviction") as redis_url:
        fronts = ["--no-workers"]
        async with (
            role_process("agent-host", redis_url, tmp_path / "host.log"),
            role_process("projector", redis_url, tmp_path / "projector.log"),
            broker_process(redis_url, log_path=tmp_path / "a.log", extra_args=fronts) as a,
            broker_process(redis_url, log_path=tmp_path / "b.log", extra_args=fronts) as b,
        ):
            urls = [a.url, b.url]
            await asyncio.gather(
                *(f.run(urls[i % 2], urls[1 - i % 2], big) for i, f in enumerate(fillers))
            )
    print([(f.made, f.refused, f.full_at) for f in fillers])
    assert all(f.full_at is not None for f in fillers), "the store never filled up"
    assert sum(f.made for f in fillers) > 0
