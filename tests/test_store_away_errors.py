"""What a client hears when the store is away: every failure a restart, a stall or a
failover gives maps, in the one shared mapping, to "try again" (``store_unavailable``),
never to "internal error"; any other error reply is not taken for one."""

from __future__ import annotations

from http import HTTPStatus

import pytest
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import (
    BusyLoadingError,
    ExecAbortError,
    MasterDownError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.errors.store import http_failure, rpc_failure
from broker.serve import Broker
from broker.store.boundary import store_error
from broker.store.client import commands
from broker.store.errors import StoreError, StoreUnavailable
from broker.store.keys import session_keys
from broker.store.retry import is_store_away

from .support.client import RawClient


def _caused_by(cause: Exception) -> Exception:
    """What a cluster client raises when no node answered its reload of the slot map."""
    unreachable = RedisClusterException(
        f"Redis Cluster cannot be connected. Please provide at least one reachable node: {cause}"
    )
    unreachable.__cause__ = cause
    return unreachable


AWAY = [
    RedisConnectionError("The previous master is now a slave"),
    MasterNotFoundError("No master found for 'acpbmaster'"),
    BusyLoadingError("Redis is loading the dataset in memory"),
    RedisTimeoutError("Timeout reading from socket"),
    ReadOnlyError("You can't write against a read only replica."),
    MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed"),
    ResponseError("NOREPLICAS Not enough good replicas to write."),
    ConnectionResetError(104, "Connection reset by peer"),
    _caused_by(RedisTimeoutError("Timeout reading from 127.0.0.1:7000")),
]
"""What redis-py raises (the reply's prefix stripped where it maps one) while a master
is being replaced."""

NOT_AWAY = [
    ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    ResponseError("ERR unknown command"),
    ExecAbortError("Transaction discarded because of previous errors."),
    ValueError("not a store error"),
    RedisClusterException("Cluster mode is not enabled on this node"),
]


@pytest.mark.parametrize("exc", AWAY, ids=lambda e: type(e).__name__ + ":" + str(e)[:12])
def test_a_store_away_is_told_as_try_again_not_internal_error(exc: Exception) -> None:
    assert is_store_away(exc)
    failure = rpc_failure(exc)
    assert failure is not None and failure.data == {"reason": "store_unavailable"}
    assert "try again" in failure.message and "internal error" not in failure.message
    assert http_failure(exc) == (HTTPStatus.SERVICE_UNAVAILABLE, failure.message)


@pytest.mark.parametrize("exc", NOT_AWAY, ids=lambda e: type(e).__name__)
def test_other_errors_are_not_taken_for_a_store_away(exc: Exception) -> None:
    assert not is_store_away(exc)
    assert rpc_failure(exc) is None


@pytest.mark.parametrize("exc", AWAY + NOT_AWAY, ids=lambda e: type(e).__name__ + ":" + str(e)[:12])
def test_a_port_raises_the_stores_own_class_and_a_client_hears_the_same(exc: Exception) -> None:
    if not isinstance(exc, RedisError):
        return  # a socket's error (or a bug) leaves a port as it came
    try:
        raise store_error(exc) from exc  # as a port raises it
    except StoreError as raised:
        mapped = raised
    assert not isinstance(mapped, RedisError)
    assert isinstance(mapped, StoreUnavailable) == is_store_away(exc) == is_store_away(mapped)
    before, after = rpc_failure(exc), rpc_failure(mapped)
    assert (before and before.to_json()) == (after and after.to_json())


async def test_a_new_session_the_store_lost_at_once_is_try_again(
    broker: Broker, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover that took the master before it replicated a session the agent host had
    just made: the front finds no session to open, and says "try again"."""
    project = broker.methods.project

    async def lost_first(tenant: str, session_id: str) -> None:
        await commands(broker.redis).delete(session_keys(tenant, session_id).snapshot)
        await project(tenant, session_id)

    monkeypatch.setattr(broker.methods, "project", lost_first)
    client = await RawClient.initialized(url)
    try:
        reply = await client.call("session/new", {"cwd": "/srv", "mcpServers": []})
        assert reply["error"]["data"]["reason"] == "store_unavailable", reply
        assert "lost the new session" in reply["error"]["message"]
        monkeypatch.undo()
        again = await client.call("session/new", {"cwd": "/srv", "mcpServers": []})
        assert again["result"]["sessionId"]
    finally:
        await client.close()
