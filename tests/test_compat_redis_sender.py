"""What ``broker.compat.redis_sender`` assumes of redis-py, checked by behaviour: the store's
own client (redis-py's command builders and RESP2 reply callbacks over the broker's own
connections) answers every command the store sends as redis-py's own client does, on one
real server, side by side."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker.store.client import connect
from broker.store.own_client import OwnClient

Step = Callable[[Any], Awaitable[Any]]


@pytest.fixture
async def both(redis_url: str) -> AsyncIterator[tuple[Any, Any]]:
    own = connect(redis_url)
    assert isinstance(own, OwnClient)
    plain = Redis.from_url(redis_url, decode_responses=True)
    yield own, plain
    await own.aclose()
    await plain.aclose()


async def _prepare(redis: Any, p: str) -> None:
    await redis.hset(f"{p}:h", mapping={"a": "1", "b": "é"})
    await redis.zadd(f"{p}:z", {"m1": 1.5, "m2": 2})
    await redis.sadd(f"{p}:s", "x", "y")
    await redis.set(f"{p}:n", 5)
    for i in range(3):
        await redis.xadd(f"{p}:x", {"ev": f"{i}", "ts": "7"}, id=f"{i + 1}-0")
    await redis.xgroup_create(f"{p}:x", "g", id="0")


STEPS: dict[str, Callable[[Any, str], Awaitable[Any]]] = {
    "hgetall": lambda r, p: r.hgetall(f"{p}:h"),
    "hmget": lambda r, p: r.hmget(f"{p}:h", ["a", "z"]),
    "hget-missing": lambda r, p: r.hget(f"{p}:h", "z"),
    "zrange-withscores": lambda r, p: r.zrange(f"{p}:z", 0, -1, withscores=True),
    "zscore": lambda r, p: r.zscore(f"{p}:z", "m1"),
    "zrangebyscore": lambda r, p: r.zrangebyscore(f"{p}:z", "(1", "+inf"),
    "smembers": lambda r, p: r.smembers(f"{p}:s"),
    "incrby": lambda r, p: r.incrby(f"{p}:n", 2),
    "set-nx-ex": lambda r, p: r.set(f"{p}:k", "v", nx=True, ex=30),
    "exists": lambda r, p: r.exists(f"{p}:k", f"{p}:none"),
    "xrange": lambda r, p: r.xrange(f"{p}:x", "-", "+", count=2),
    "xrevrange": lambda r, p: r.xrevrange(f"{p}:x"),
    "xlen": lambda r, p: r.xlen(f"{p}:x"),
    "xreadgroup": lambda r, p: r.xreadgroup("g", "c", {f"{p}:x": ">"}, count=2),
    "xreadgroup-block": lambda r, p: r.xreadgroup("g", "c", {f"{p}:x": ">"}, block=50),
    "xpending_range": lambda r, p: r.xpending_range(f"{p}:x", "g", "-", "+", 10),
    "xautoclaim": lambda r, p: r.xautoclaim(f"{p}:x", "g", "d", 0, count=5),
    "xinfo_stream": lambda r, p: r.xinfo_stream(f"{p}:x"),
    "xread-block-empty": lambda r, p: r.xread({f"{p}:x": "$"}, block=50),
    "scan_iter": lambda r, p: _sorted(r.scan_iter(match=f"{p}:*", count=2)),
    "config_get": lambda r, p: r.config_get("maxmemory-policy"),
    "info-keys": lambda r, p: _info_keys(r),
    "script": lambda r, p: r.register_script("return {KEYS[1], ARGV[1]}")([f"{p}:k"], [3]),
    "pipeline": lambda r, p: _pipeline(r, p, transaction=False),
    "transaction": lambda r, p: _pipeline(r, p, transaction=True),
    "pipeline-script": lambda r, p: _pipeline_script(r, p),
}


async def _sorted(keys: AsyncIterator[str]) -> list[str]:
    return sorted([key async for key in keys])


async def _info_keys(redis: Any) -> list[str]:
    return sorted(k for k in await redis.info("memory") if k.startswith("used_memory"))[:3]


async def _pipeline(redis: Any, p: str, *, transaction: bool) -> list[Any]:
    async with redis.pipeline(transaction=transaction) as pipe:
        pipe.hgetall(f"{p}:h")
        pipe.incrby(f"{p}:n", 1)
        pipe.zrange(f"{p}:z", 0, -1, withscores=True)
        pipe.xrange(f"{p}:x", count=1)
        return list(await pipe.execute())


async def _pipeline_script(redis: Any, p: str) -> list[Any]:
    await redis.script_flush()  # the pipeline loads what it runs
    script = redis.register_script("return tonumber(ARGV[1]) * 2")
    async with redis.pipeline(transaction=False) as pipe:
        await script(keys=[f"{p}:k"], args=[21], client=pipe)
        pipe.get(f"{p}:n")
        return list(await pipe.execute())


@pytest.mark.parametrize("name", sorted(STEPS))
async def test_the_own_client_answers_as_redis_py_does(both: tuple[Any, Any], name: str) -> None:
    own, plain = both
    answers = []
    for redis, prefix in ((own, "{own}"), (plain, "{plain}")):
        await _prepare(redis, f"{prefix}{name}")
        answers.append(await STEPS[name](redis, f"{prefix}{name}"))
    mine, theirs = (_unprefixed(a) for a in answers)
    assert mine == theirs


def _unprefixed(value: Any) -> Any:
    """``value`` with the key prefixes of either client made alike."""
    if isinstance(value, str):
        return value.replace("{own}", "{p}").replace("{plain}", "{p}")
    if isinstance(value, list | tuple):
        return type(value)(_unprefixed(v) for v in value)
    if isinstance(value, dict):
        return {_unprefixed(k): _unprefixed(v) for k, v in value.items()}
    if isinstance(value, set):
        return {_unprefixed(v) for v in value}
    return value


async def test_errors_in_a_pipeline_are_raised_and_annotated_as_redis_py_does(
    both: tuple[Any, Any],
) -> None:
    messages = []
    for redis in both:
        await redis.set("{e}:str", "x")
        async with redis.pipeline(transaction=False) as pipe:
            pipe.get("{e}:str")
            pipe.hget("{e}:str", "f")
            with pytest.raises(ResponseError) as raised:
                await pipe.execute()
        messages.append(str(raised.value))
        async with redis.pipeline(transaction=False) as pipe:
            pipe.get("{e}:str")
            pipe.hget("{e}:str", "f")
            replies = await pipe.execute(raise_on_error=False)
        assert replies[0] == "x" and isinstance(replies[1], ResponseError)
    assert messages[0] == messages[1]
    assert "Command # 2" in messages[0] and "WRONGTYPE" in messages[0]


async def test_a_refused_transaction_raises_the_queued_commands_error(
    both: tuple[Any, Any],
) -> None:
    raised = []
    for redis in both:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.set("{t}:k", "v")
            pipe.execute_command("NOSUCHCOMMAND")
            with pytest.raises(ResponseError) as error:
                await pipe.execute()
        raised.append(type(error.value))
        assert await redis.get("{t}:k") is None  # nothing of it ran
    assert raised[0] is raised[1]
