"""What a role checks of its Redis at start-up and in ``/readyz``, on real redis-servers.

- an evicting ``maxmemory-policy`` is refused in one line naming the fix; with
  ``--allow-evicting-store`` the role starts, warns, and ``/readyz`` notes it;
- an ACL user made the Redis 7 default way (no channel) is refused naming ``&*``; one
  without ``@dangerous`` starts and becomes ready (readiness needs no INFO);
- a read-only replica or a full Redis makes ``/readyz`` 503 with the reason;
- TLS: a private CA trusted with ``ssl_ca_certs``, client certificates; a plain
  ``redis://`` to a TLS port says to use ``rediss://``; a missing CA file is named;
- no secret of a store URL (``user:pass@``, ``?password=``) is ever printed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from broker.serve import Broker
from broker.store.client import connect
from broker.store.faults import ACL_RULE
from broker.store.preflight import StoreRefused, preflight
from broker.store.readiness import StoreReadiness

from .conftest import make_settings
from .support.broker_process import ROOT, broker_env
from .support.client import acp_client
from .support.redis_server import free_port, redis_server
from .support.redis_tls import tls_redis

PASSWORD = "hunter2-s3cret"


def acp_broker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=broker_env(),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("acp-broker ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def with_user(url: str, name: str) -> str:
    return url.replace("redis://", f"redis://{name}:{PASSWORD}@")


@pytest.fixture
def acl_users(redis_url: str) -> Iterator[str]:
    """Users on the test's Redis: ``nochannels`` (Redis 7's default for a new user: every
    key and command, no channel), ``leastpriv`` (the documented rule: the broker's keys and
    channels, no @dangerous)."""
    with redis.Redis.from_url(redis_url) as admin:
        admin.execute_command("ACL", "SETUSER", "nochannels", "on", f">{PASSWORD}", "~*", "+@all")
        rule = ACL_RULE.replace("PASSWORD", PASSWORD)  # the rule docs/redis.md gives
        admin.execute_command("ACL", "SETUSER", "leastpriv", *rule.split())
        try:
            yield redis_url
        finally:
            admin.execute_command("ACL", "DELUSER", "nochannels", "leastpriv")


async def get(url: str) -> tuple[int, dict[str, Any]]:
    def fetch() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    return await asyncio.to_thread(fetch)


@pytest.fixture(params=["redis", "embedded", "cluster", "sentinel"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_every_topology_passes_the_start_up_checks_and_is_ready(store: Any) -> None:
    facts = await preflight(store, allow_evicting=False, tls=False)
    assert facts.policy == "noeviction" and not facts.warnings
    assert await StoreReadiness(store)() is None


def test_an_evicting_policy_is_refused_in_one_line() -> None:
    with redis_server("--maxmemory-policy", "allkeys-lru") as url:
        line = one_error_line(acp_broker("worker", "projector", "--redis-url", url))
    assert "maxmemory-policy is allkeys-lru" in line, line
    assert "noeviction" in line and "--allow-evicting-store" in line, line


async def test_an_evicting_policy_allowed_starts_warns_and_readyz_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with redis_server("--maxmemory-policy", "allkeys-lru") as url:
        node = Broker(make_settings(redis_url=url, allow_evicting_store=True))
        with caplog.at_level(logging.WARNING):
            await node.start()
        try:
            assert any("allkeys-lru" in r.getMessage() for r in caplog.records)
            status, report = await get(f"http://127.0.0.1:{node.http_port}/readyz")
            assert status == 200, report
            assert "allkeys-lru" in report["checks"]["redis"]["note"]
        finally:
            await node.stop()


async def test_an_evicting_policy_set_after_start_up_makes_readyz_503(redis_url: str) -> None:
    node = Broker(make_settings(redis_url=redis_url))
    await node.start()
    try:
        assert (await get(f"http://127.0.0.1:{node.http_port}/readyz"))[0] == 200
        with redis.Redis.from_url(redis_url) as admin:
            admin.config_set("maxmemory-policy", "volatile-lru")
            try:
                status, report = await get(f"http://127.0.0.1:{node.http_port}/readyz")
            finally:
                admin.config_set("maxmemory-policy", "noeviction")
        assert status == 503, report
        assert "maxmemory-policy is volatile-lru" in report["checks"]["redis"]["error"]
    finally:
        await node.stop()


async def test_a_user_without_channel_permission_is_refused_naming_it(acl_users: str) -> None:
    store = connect(with_user(acl_users, "nochannels"))
    try:
        with pytest.raises(StoreRefused, match=r"pub/sub channels .*'&\*'"):
            await preflight(store, allow_evicting=False, tls=False)
    finally:
        await store.aclose()
    line = one_error_line(
        acp_broker("worker", "projector", "--redis-url", with_user(acl_users, "nochannels"))
    )
    assert "&*" in line and PASSWORD not in line, line


async def test_a_user_without_dangerous_commands_starts_and_is_ready(
    acl_users: str, caplog: pytest.LogCaptureFixture
) -> None:
    node = Broker(make_settings(redis_url=with_user(acl_users, "leastpriv")))
    with caplog.at_level(logging.WARNING):
        await node.start()
    try:
        assert any("could not check" in r.getMessage() for r in caplog.records)
        status, report = await get(f"http://127.0.0.1:{node.http_port}/readyz")
        assert status == 200, report
        client = await acp_client(f"ws://127.0.0.1:{node.port}/acp")  # and it serves
        session_id = await client.new(cwd="/least")
        assert (await client.prompt(session_id, "/notool hi")).stop_reason == "end_turn"
        listed = await client.conn.list_sessions()
        assert session_id in [s.session_id for s in listed.sessions]
        await client.close()
    finally:
        await node.stop()


async def test_a_read_only_replica_is_not_ready(redis_url: str) -> None:
    with redis_server("--replicaof", "127.0.0.1", redis_url.rsplit(":", 1)[1].split("/")[0]) as url:
        store = connect(url)
        try:
            with pytest.raises(Exception, match="read-only replica"):
                await StoreReadiness(store)()
        finally:
            await store.aclose()


def test_a_password_in_the_query_is_never_printed() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?password={PASSWORD}"  # nothing listens there
    result = acp_broker("worker", "projector", "--redis-url", url)
    line = one_error_line(result)
    assert "password=***" in line, line
    assert PASSWORD not in result.stderr + result.stdout


async def test_tls_with_a_private_ca_and_client_certificates() -> None:
    with tls_redis(client_certs=True) as server:
        folder = server.folder
        query = (
            f"?ssl_ca_certs={server.ca}&ssl_certfile={folder / 'client.crt'}"
            f"&ssl_keyfile={folder / 'client.key'}"
        )
        store = connect(server.url(query))
        try:
            await preflight(store, allow_evicting=False, tls=True)
            assert await StoreReadiness(store)() is None
        finally:
            await store.aclose()


def test_tls_mistakes_are_told_with_their_fix() -> None:
    with tls_redis() as server:
        plain = server.url().replace("rediss://", "redis://")
        line = one_error_line(acp_broker("worker", "projector", "--redis-url", plain))
        assert "use rediss://" in line, line
        line = one_error_line(acp_broker("worker", "projector", "--redis-url", server.url()))
        assert "ssl_ca_certs" in line, line
    missing = "/nonexistent/acpb-ca.crt"
    result = acp_broker(
        "worker", "projector", "--redis-url", f"rediss://127.0.0.1:1/0?ssl_ca_certs={missing}"
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result
    assert missing in result.stderr and "does not exist" in result.stderr, result.stderr


async def test_sentinels_with_a_password_of_their_own() -> None:
    """``?sentinel_password=``: the Sentinels' own credentials, never printed."""
    from .support.redis_sentinel import sentinel_set

    with sentinel_set(sentinel_password=PASSWORD) as sentinels:
        store = connect(sentinels.url(query=f"sentinel_password={PASSWORD}"))
        try:
            await preflight(store, allow_evicting=False, tls=False)
            assert await StoreReadiness(store)() is None
        finally:
            await store.aclose()
        started = time.monotonic()
        line = one_error_line(acp_broker("worker", "projector", "--redis-url", sentinels.url()))
        assert "sentinel_password" in line and "redis.asyncio" not in line, line
        assert time.monotonic() - started < 20  # every Sentinel asked, not again and again
        result = acp_broker(
            "worker", "projector", "--redis-url", sentinels.url(query="sentinel_password=wrong")
        )
        assert "wrong" not in one_error_line(result) and "sentinel_password=***" in result.stderr
