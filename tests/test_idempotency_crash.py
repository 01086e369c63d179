"""A front killed between an ``Idempotency-Key``'s claim and its settle: a retry creates.

Real processes on a real redis-server: two front-only nodes, an agent host and a projector.
The host is stopped (SIGSTOP) so that the create a ``POST /v1/sessions`` with an
``Idempotency-Key`` starts on front A waits, A is killed (``kill -9``) once the key is
claimed, the host goes on (SIGCONT), and the client retries with the same key on front B:
within 30 s it gets a session (the claim A left lapsed, B took the key over and created),
and a further retry gets that same session. (A claim kept 24 h made every retry wait 30 s
and get 503, for 24 hours.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from broker.store.client import commands, connect

from .support.broker_process import broker_process
from .support.client import wait_for
from .support.redis_server import redis_server
from .support.roles import role_process

pytestmark = pytest.mark.slow

RETRY_WITHIN = 30.0
BODY = {"cwd": "/idem"}
KEY = {"Idempotency-Key": "create-after-a-crash"}


async def test_a_retry_creates_once_the_front_that_claimed_the_key_died(tmp_path: Path) -> None:
    with redis_server() as redis_url:
        redis = connect(redis_url)
        fronts = ["--no-workers", "--http-port", "0"]
        try:
            async with (
                role_process("agent-host", redis_url, tmp_path / "host.log") as host,
                role_process("projector", redis_url, tmp_path / "projector.log"),
                broker_process(redis_url, log_path=tmp_path / "a.log", extra_args=fronts) as a,
                broker_process(redis_url, log_path=tmp_path / "b.log", extra_args=fronts) as b,
            ):
                os.kill(host.proc.pid, signal.SIGSTOP)  # alive, announced, answering nothing
                try:
                    first = asyncio.ensure_future(_post(a.http_port))
                    await wait_for(lambda: _claimed(redis), what="the key to be claimed")
                    await a.kill()  # between the claim and the settle
                    first.cancel()
                finally:
                    os.kill(host.proc.pid, signal.SIGCONT)
                started = time.monotonic()
                retried = await _post(b.http_port)
                took = time.monotonic() - started
                assert retried.status_code == 201, retried.text
                assert took <= RETRY_WITHIN, took
                again = await _post(b.http_port)
                assert again.status_code == 201 and again.json()["id"] == retried.json()["id"]
        finally:
            await redis.aclose()


async def _claimed(redis: Any) -> list[Any]:
    return [k async for k in commands(redis).scan_iter("acpb:op:*")]


async def _post(port: int) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        return await http.post("/v1/sessions", json=BODY, headers=KEY)
