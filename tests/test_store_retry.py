"""The one retry helper: tried again while the store is away, as long as its pauses last."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from broker.store.retry import doubling, retry_store, retrying


def _failing(times: int, error: Exception) -> tuple[Callable[[], Any], list[int]]:
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "done"

    return call, calls


async def test_a_call_is_tried_again_after_each_pause_until_it_answers() -> None:
    call, calls = _failing(3, RedisConnectionError("away"))
    assert await retry_store(call, [0.0] * 5) == "done" and len(calls) == 4


async def test_the_last_error_is_raised_when_the_pauses_run_out() -> None:
    call, calls = _failing(10, RedisConnectionError("away"))
    with pytest.raises(RedisConnectionError):
        await retry_store(call, [0.0, 0.0])
    assert len(calls) == 3


async def test_keep_may_give_up_and_an_error_reply_is_never_tried_again() -> None:
    call, calls = _failing(10, RedisConnectionError("away"))
    with pytest.raises(RedisConnectionError):
        await retry_store(call, itertools.repeat(0.0), keep=lambda exc: len(calls) < 2)
    assert len(calls) == 2
    refused, tried = _failing(10, ResponseError("WRONGTYPE"))
    with pytest.raises(ResponseError):
        await retry_store(refused, itertools.repeat(0.0))
    assert len(tried) == 1


async def test_a_deadline_bounds_the_attempts() -> None:
    call, calls = _failing(1000, RedisConnectionError("away"))
    with pytest.raises(RedisConnectionError):
        await retrying(call, 0.2)
    assert 2 <= len(calls) <= 4  # pauses of 0.05 and 0.1 fit in 0.2 s


def test_pauses_double_up_to_their_cap() -> None:
    assert list(itertools.islice(doubling(0.1, 0.5), 5)) == [0.1, 0.2, 0.4, 0.5, 0.5]


# -- the helper itself (broker.retry), as the callers outside the store use it ----------------


async def test_a_poll_returns_what_it_waited_for_or_its_last_result_at_the_deadline() -> None:
    from broker.retry import retry, steady, within

    seen = iter(["pending", "pending", "done"])
    assert await retry(lambda: _value(next(seen)), steady(0.0), again=_is_pending) == "done"
    pauses = within(steady(0.01), 0.05)
    assert await retry(lambda: _value("pending"), pauses, again=_is_pending) == "pending"


async def test_an_error_not_listed_is_never_tried_again() -> None:
    from broker.retry import retry

    call, calls = _failing(10, RedisConnectionError("away"))
    with pytest.raises(RedisConnectionError):
        await retry(call, itertools.repeat(0.0))  # no errors listed: none passes
    assert len(calls) == 1


def test_redis_pys_reconnecting_retry_pauses_as_the_helper_doubles() -> None:
    from broker.retry import doubling_pause

    assert [doubling_pause(n, 0.1, 0.5) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]


async def _value(value: str) -> str:
    return value


def _is_pending(value: str) -> bool:
    return value == "pending"
