"""What ``broker/store/retry.py`` does for a cluster that is moving, checked on its own."""

from __future__ import annotations

from redis.exceptions import ClusterError, TryAgainError

from broker.store.boundary import store_error
from broker.store.errors import StoreUnavailable
from broker.store.retry import RETRIED, STORE_MOVING, retrying, unheard


async def test_retrying_tries_again_what_the_cluster_did_not_run() -> None:
    assert TryAgainError in STORE_MOVING and ClusterError in STORE_MOVING
    assert set(STORE_MOVING) <= set(RETRIED)
    # and a port raises each as the store's "out of reach, try again"
    moving = [TryAgainError("TRYAGAIN"), ClusterError("TTL exhausted")]
    assert all(isinstance(store_error(exc), StoreUnavailable) for exc in moving)
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
