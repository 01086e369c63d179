"""Store URLs and the engine's pure decisions: masking, the Sentinel form, topology, what
a failure means, the breaker's gate (on a real redis-server)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

import pytest
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ReadOnlyError, ResponseError

from broker.errors.store import store_unreachable
from broker.logs import redact
from broker.ops import metrics
from broker.store.breaker import PROBE_TIMEOUT, StoreAway, StoreBreaker, breaker_of
from broker.store.client import Topology, commands, connect, masked_url, topology
from broker.store.faults import connection_hint, missing_permission, write_problem
from broker.store.preflight import warn_while_evicting
from broker.store.sentinel import parse_sentinel_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://u:pw@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://u@h:6379/0", "redis://u@h:6379/0"),
        ("redis://h:6379/0?password=pw&db=1", "redis://h:6379/0?password=***&db=1"),
        (
            "rediss+sentinel://u:pw@a:1,b:2/m/0?sentinel_password=s&ssl_ca_certs=/ca.crt",
            "rediss+sentinel://u:***@a:1,b:2/m/0?sentinel_password=***&ssl_ca_certs=/ca.crt",
        ),
        ("redis+cluster://:p%40ss@h:7000", "redis+cluster://:***@h:7000"),
        (None, "embedded (in-process, not durable)"),
    ],
)
def test_every_secret_of_a_store_url_is_masked(url: str | None, shown: str) -> None:
    assert masked_url(url) == shown


def test_a_log_line_quoting_a_store_url_is_masked() -> None:
    line = "cannot use redis://:pw1@h:1/0 nor redis+sentinel://a:1/m?sentinel_password=pw2."
    masked = redact(line)
    assert "pw1" not in masked and "pw2" not in masked
    assert "redis://:***@h:1/0" in masked and "sentinel_password=***" in masked


def test_a_sentinel_url_names_sentinels_master_db_and_credentials() -> None:
    found = parse_sentinel_url(
        "rediss+sentinel://user:p%40ss@10.0.0.1:26379,[::1]:26380/mymaster/2"
        "?sentinel_username=su&sentinel_password=sp&ssl_ca_certs=/ca.crt"
    )
    assert found.sentinels == [("10.0.0.1", 26379), ("::1", 26380)]
    assert (found.master, found.db, found.username, found.password) == (
        "mymaster",
        2,
        "user",
        "p@ss",
    )
    assert found.tls and found.tls_options == {"ssl_ca_certs": "/ca.crt"}
    assert found.sentinel_credentials == {"username": "su", "password": "sp"}
    assert parse_sentinel_url("redis+sentinel://h:1/m").db == 0


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://:pw@h:1", "ends with /MASTER_NAME"),
        ("redis+sentinel://:pw@h/m", "HOST:PORT"),
        ("redis+sentinel:///m", "at least one HOST:PORT"),
        ("redis+sentinel://h:1/m/x", "ends with /MASTER_NAME"),
        ("redis+sentinel://h:1/m?sentinel_pasword=pw", "unknown option sentinel_pasword"),
    ],
)
def test_a_wrong_sentinel_url_is_told_without_its_password(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as err:
        parse_sentinel_url(url)
    assert ":pw@" not in str(err.value) and "=pw" not in str(err.value)


def test_connect_decides_the_topology_once() -> None:
    assert topology(connect(None)) is Topology.EMBEDDED
    assert topology(connect("redis://127.0.0.1:1/0")) is Topology.STANDALONE
    assert topology(connect("redis+sentinel://127.0.0.1:1/m")) is Topology.SENTINEL
    assert topology(connect("redis+cluster://127.0.0.1:1")) is Topology.CLUSTER


def test_a_missing_tls_file_is_named() -> None:
    with pytest.raises(FileNotFoundError, match=r"ssl_certfile names '/nope/c\.crt'"):
        connect("rediss://h:1/0?ssl_certfile=/nope/c.crt")


def test_a_sentinel_without_a_master_is_told_briefly() -> None:
    lost = MasterNotFoundError("No master found for 'm' : <redis.asyncio.client.Redis(<…>)>")
    told = store_unreachable(lost).message
    assert "No master found for 'm')" in told and "redis.asyncio" not in told
    assert "failing over" in write_problem(lost) and "redis.asyncio" not in write_problem(lost)


def test_what_a_failure_means() -> None:
    assert "read-only replica" in write_problem(ReadOnlyError("READONLY You can't write"))
    assert "store full" in write_problem(
        ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
    )
    channels = NoPermissionError(
        "this user has no permissions to access one of the channels used as arguments"
    )
    assert "'&*'" in missing_permission(channels, "SPUBLISH")
    command = NoPermissionError("this user has no permissions to run the 'xautoclaim' command")
    assert "'+xautoclaim'" in missing_permission(command, "XAUTOCLAIM")
    reset = RedisConnectionError("Error while reading: (104, 'Connection reset by peer')")
    assert "use rediss://" in connection_hint(reset, tls=False)
    assert connection_hint(reset, tls=True) == ""
    untrusted = RedisConnectionError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    untrusted.__cause__ = ssl.SSLCertVerificationError()
    assert "ssl_ca_certs" in connection_hint(untrusted, tls=True)


async def test_the_breaker_fails_commands_at_once_while_open_and_not_after(
    redis_url: str,
) -> None:
    store = connect(redis_url)
    breaker = breaker_of(store)
    assert breaker is not None and not breaker.away
    try:
        assert await commands(store).ping()
        breaker.open(RedisConnectionError("probe failed"))
        assert metrics.STORE_AWAY._value.get() == 1
        started = time.monotonic()
        with pytest.raises(StoreAway, match="failing fast"):
            await commands(store).set("k", "v")
        assert time.monotonic() - started < 1.0
        breaker.close()
        assert metrics.STORE_AWAY._value.get() == 0
        assert await commands(store).set("k", "v")
    finally:
        await store.aclose()
    assert breaker_of(connect(None)) is None


async def test_an_allowed_evicting_store_is_warned_about_again_and_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING), contextlib.suppress(TimeoutError):
        await asyncio.wait_for(warn_while_evicting("allkeys-lru", interval=0.05), 0.3)
    warnings = [r for r in caplog.records if "allkeys-lru" in r.getMessage()]
    assert len(warnings) >= 3 and "--allow-evicting-store" in warnings[0].getMessage()


class _SlowOnce:
    """A store whose first PING is answered late (the loop held up), the rest at once."""

    def __init__(self) -> None:
        self.pings = 0

    async def ping(self) -> bool:
        self.pings += 1
        if self.pings == 1:
            await asyncio.sleep(PROBE_TIMEOUT + 0.5)
        return True


async def test_one_late_probe_does_not_open_the_breaker_two_do() -> None:
    breaker, store = StoreBreaker(), _SlowOnce()
    watching = asyncio.create_task(breaker.watch(store))
    try:
        deadline = time.monotonic() + 10
        while store.pings < 3:
            assert not breaker.away
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    finally:
        watching.cancel()
    stalled = _SlowOnce()
    stalled.ping = lambda: asyncio.sleep(60)  # type: ignore[method-assign,assignment,return-value]
    watching = asyncio.create_task(breaker.watch(stalled))
    try:
        deadline = time.monotonic() + 2 * PROBE_TIMEOUT + 2
        while not breaker.away:
            assert time.monotonic() < deadline, "two unanswered probes did not open it"
            await asyncio.sleep(0.01)
    finally:
        watching.cancel()
        breaker.close()
