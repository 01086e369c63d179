"""What ``broker/store/cluster.py`` and ``retry.py`` assume, checked on their own."""

from __future__ import annotations

import inspect

from redis.asyncio.cluster import PipelineStrategy, RedisCluster
from redis.exceptions import ClusterError, TryAgainError

from broker.store.cluster import _RELOADERS, PatientCluster
from broker.store.retry import STORE_AWAY, STORE_MOVING, retrying, unheard


def test_redis_py_still_reloads_its_slot_map_by_closing_itself_where_we_expect() -> None:
    """PatientCluster.aclose() tells redis-py's own reload calls by their function names."""
    assert "await self.aclose()" in inspect.getsource(RedisCluster._execute_command)
    assert "cluster_client.aclose()" in inspect.getsource(PipelineStrategy.execute)
    assert {"_execute_command", "execute"} == _RELOADERS


async def test_a_close_asked_by_the_broker_closes_and_one_from_redis_py_only_reloads() -> None:
    client = PatientCluster(host="127.0.0.1", port=1)
    client._initialize = False  # as once initialized

    async def _execute_command() -> None:  # named as redis-py's, but not in its module
        await client.aclose()

    await _execute_command()
    assert client._initialize  # closed for real: RedisCluster.aclose sets it too
    await client.aclose()


async def test_retrying_tries_again_what_the_cluster_did_not_run() -> None:
    assert TryAgainError in STORE_MOVING and ClusterError in STORE_MOVING
    assert set(STORE_MOVING) <= set(STORE_AWAY)
    calls: list[int] = []

    async def call() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot")
        return len(calls)

    assert await retrying(call, 5.0, STORE_MOVING) == 3


async def test_retrying_publishes_again_until_heard_then_gives_the_last_count() -> None:
    counts = iter([0, 0, 2])
    assert await retrying(lambda: _value(next(counts)), 5.0, (), again=unheard) == 2
    assert await retrying(lambda: _value(0), 0.01, (), again=unheard) == 0


async def _value(value: int) -> int:
    return value
