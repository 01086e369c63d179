"""A broker on a Redis Sentinel set (1 master, 1 replica, 3 Sentinels) serves through a
failover: ``SENTINEL FAILOVER``, and a kill -9 of the master.

A real ``acp-broker serve`` process (front, agent host and projector) reaches the master
through ``redis+sentinel://``. While the master changes, requests fail with a clear "try
again" error (never "internal error") within their deadline; within 10 s of the fault,
every role serves again by itself: a new session takes a prompt (front, agent host, lease,
appends, pub/sub), is listed (projector), and ``/readyz`` is 200; the same with the
front, the agent host and the projector as three processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError

from broker.store.client import connect

from .support.broker_process import BrokerProcess, broker_process
from .support.client import RawClient, text
from .support.redis_sentinel import SentinelSet, sentinel_set
from .support.roles import role_process
from .test_redis_faults import ENV, REQUEST_TIMEOUT, SLACK, _readyz

pytestmark = pytest.mark.slow

RECOVERY = 10.0
"""Seconds after the fault within which every role serves again (the promise)."""


async def _attempt(node: BrokerProcess) -> tuple[float, str | None]:
    """session/new then a prompt, on a new connection: (seconds taken, the error or None)."""
    started = time.monotonic()
    client = await RawClient.initialized(node.url)
    try:
        reply = await client.call(
            "session/new", {"cwd": "/failover", "mcpServers": []}, REQUEST_TIMEOUT + SLACK
        )
        if "error" in reply:
            return time.monotonic() - started, str(reply["error"]["message"])
        session_id = reply["result"]["sessionId"]
        reply = await client.call(
            "session/prompt",
            {"sessionId": session_id, "prompt": text("/notool")},
            REQUEST_TIMEOUT + SLACK,
        )
        if "error" in reply:
            return time.monotonic() - started, str(reply["error"]["message"])
        listed = await client.call("session/list", {}, REQUEST_TIMEOUT + SLACK)
        ids = [s["sessionId"] for s in listed.get("result", {}).get("sessions", [])]
        if session_id not in ids:
            return time.monotonic() - started, "not listed yet"
        return time.monotonic() - started, None
    finally:
        await client.close()


async def _through(node: BrokerProcess, fault: asyncio.Future[int]) -> tuple[float, list[str]]:
    """Attempts from the fault on until one works: (seconds after the fault, errors seen)."""
    started = time.monotonic()
    errors: list[str] = []
    while time.monotonic() - started < 30:
        took, error = await _attempt(node)
        assert took <= 2 * (REQUEST_TIMEOUT + SLACK), f"an attempt hung {took:.1f} s"
        if error is None and fault.done():
            return time.monotonic() - started, errors
        if error is not None:
            errors.append(error)
        await asyncio.sleep(0.2)
    raise AssertionError(f"not served again within 30 s: {errors[-5:]}")


async def _serves_through(
    sentinels: SentinelSet, tmp_path: Path, kill: bool, apart: bool = False
) -> None:
    """``apart``: the front, the agent host and the projector as three processes."""
    url = sentinels.url()
    async with contextlib.AsyncExitStack() as roles:
        if apart:
            for role in ("agent-host", "projector"):
                log_path = tmp_path / f"{role}.log"
                await roles.enter_async_context(role_process(role, url, log_path, env=ENV))
        node = await roles.enter_async_context(
            broker_process(
                url,
                log_path=tmp_path / "broker.log",
                env=ENV,
                extra_args=["--no-workers"] if apart else [],
            )
        )
        try:
            await _fault_served_through(node, sentinels, kill)
        except BaseException:
            print(f"the broker's log:\n{node.log_text()}")  # which request failed, and why
            raise


async def _fault_served_through(node: BrokerProcess, sentinels: SentinelSet, kill: bool) -> None:
    """The fault while ``node`` serves, and what its clients see through it."""
    _, error = await _attempt(node)
    assert error is None, error
    watcher = await RawClient.initialized(node.url)
    reply = await watcher.call("session/new", {"cwd": "/watched", "mcpServers": []}, 30)
    watched = reply["result"]["sessionId"]
    prompt_id = f"prompt-{time.monotonic_ns()}"
    await watcher.send_prompt(prompt_id, watched, "/slow 30")
    await watcher.read_chunks(watched, 3, 20)

    loop = asyncio.get_running_loop()
    fault_at = time.monotonic()
    fault = loop.run_in_executor(None, sentinels.kill_master if kill else sentinels.failover)
    recovered, errors = await _through(node, fault)
    await fault
    print(f"{'kill -9' if kill else 'SENTINEL FAILOVER'}: served again {recovered:.1f} s after")
    print(f"errors meanwhile: {errors}")
    assert recovered <= RECOVERY + SLACK, (recovered, errors)
    assert not any("internal error" in e for e in errors), errors
    assert all("try again" in e or e == "not listed yet" for e in errors), errors

    # Ready again within the same bound (its pub/sub check passes once a probe of the
    # new subscription is heard, a moment after the first request is served).
    while (ready := await _readyz(node))[0] != 200:
        assert time.monotonic() - fault_at <= RECOVERY + SLACK, ready
        await asyncio.sleep(0.2)
    # The prompt that streamed through the failover ends, or says clearly why not.
    reply = await watcher.reply_to(prompt_id, timeout=60)
    assert "result" in reply or "try again" in reply["error"]["message"], reply
    await watcher.close()
    assert "internal error" not in node.log_text()


async def test_a_sentinel_failover_is_served_through(tmp_path: Path) -> None:
    with sentinel_set() as sentinels:
        await _serves_through(sentinels, tmp_path, kill=False)


async def test_a_killed_master_is_replaced_and_served_through(tmp_path: Path) -> None:
    with sentinel_set() as sentinels:
        await _serves_through(sentinels, tmp_path, kill=True)


async def test_roles_running_apart_serve_through_a_killed_master(tmp_path: Path) -> None:
    with sentinel_set() as sentinels:
        await _serves_through(sentinels, tmp_path, kill=True, apart=True)


async def test_a_tls_sentinel_set_with_a_private_ca_is_served_through_a_failover(
    tmp_path: Path,
) -> None:
    """``rediss+sentinel://…?ssl_ca_certs=CA``: TLS to the Sentinels and the servers."""
    with sentinel_set(tls=True) as sentinels:
        assert sentinels.url().startswith("rediss+sentinel://")
        await _serves_through(sentinels, tmp_path, kill=False)


async def test_a_plain_url_to_a_demoted_master_says_so_instead_of_internal_error(
    tmp_path: Path,
) -> None:
    """``redis://`` at the master's own address cannot follow a failover: once that server
    is a replica, requests are told to try again (the write did not run), never "internal
    error", and ``/readyz`` is 503 saying the server is a read-only replica."""
    with sentinel_set() as sentinels:
        plain = f"redis://127.0.0.1:{sentinels.master_port()}/0"
        async with broker_process(plain, log_path=tmp_path / "broker.log", env=ENV) as node:
            _, error = await _attempt(node)
            assert error is None, error
            await asyncio.get_running_loop().run_in_executor(None, sentinels.failover)
            # The Sentinels turn the old master into a replica once they have seen it
            # still say "master" twice, 8 s apart, on their 10 s round of INFO: up to ~20 s.
            deadline = time.monotonic() + 30
            while True:  # until the demotion is seen
                took, error = await _attempt(node)
                assert took <= 2 * (REQUEST_TIMEOUT + SLACK), f"an attempt hung {took:.1f} s"
                # A session the old master made just before its demotion is dropped by its
                # resync as a replica (Redis's replication did not keep it): that attempt's
                # prompt finds no session. Not the case under test: the next attempt is.
                if error is not None and error != "session not found":
                    break
                assert time.monotonic() < deadline, "the old master still took writes"
            assert "try again" in error and "internal error" not in error, error
            status, report = await _readyz(node)
            assert status == 503, report
            assert "read-only replica" in report["checks"]["redis"]["error"], report
        assert "internal error" not in node.log_text()


async def test_every_connection_follows_a_switch_of_master_before_the_old_one_is_demoted() -> None:
    """After ``SENTINEL FAILOVER`` the old master goes on taking writes until the Sentinels
    demote it (up to ~20 s later), and its resync then drops them: a client's pooled
    connections, a blocked read and a subscriber must leave it at the switch, not wait for
    its ``READONLY``. Within a few seconds of the new master taking writes, every write
    lands there, a read blocked on the old master is answered by the new one, and a
    subscriber hears what is published on the new one."""
    with sentinel_set() as sentinels:
        client: Any = connect(sentinels.url(), timeout=30.0)  # a blocked read waits long
        pubsub = client.pubsub()
        try:
            await asyncio.gather(*(client.blpop(["acpb:t:idle"], 0.05) for _ in range(6)))
            await pubsub.subscribe("acpb:t:ch")
            blocked = asyncio.ensure_future(client.blpop(["acpb:t:list"], 0))
            new = await asyncio.get_running_loop().run_in_executor(None, sentinels.failover)
            with sentinels.client(new) as direct:
                deadline = time.monotonic() + 5  # the follower asks every second
                while True:
                    with contextlib.suppress(ConnectionError):  # "failing over": not yet
                        await client.set("acpb:t:probe", "x")
                    if direct.get("acpb:t:probe") == b"x":
                        break
                    assert time.monotonic() < deadline, "writes still go to the old master"
                    await asyncio.sleep(0.1)
                for n in range(20):  # each on whichever pooled connection is free
                    await asyncio.gather(*(client.set(f"acpb:t:{n}:{i}", n) for i in range(6)))
                    assert all(direct.get(f"acpb:t:{n}:{i}") == str(n).encode() for i in range(6))
                direct.rpush("acpb:t:list", "y")
                assert tuple(await asyncio.wait_for(blocked, 5)) == ("acpb:t:list", "y")
                heard = None
                async with asyncio.timeout(5):
                    while heard is None:
                        direct.publish("acpb:t:ch", "hi")
                        with contextlib.suppress(ConnectionError):
                            heard = await pubsub.get_message(True, timeout=0.2)
                assert heard["data"] == "hi"
        finally:
            await pubsub.aclose()
            await client.aclose()
