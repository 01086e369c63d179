"""Calling one Lua script many times, in as few round trips as the store's topology allows."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .client import Store, commands, is_cluster


async def call_each(
    redis: Store, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """The replies to ``script`` (what ``redis.register_script`` made) called with each
    (keys, args) of ``calls``, in order: one pipeline of ``EVALSHA`` on one server (the
    script loaded first, so that ``EVALSHA`` finds it on a Redis restarted meanwhile); on a
    Redis Cluster, whose pipeline runs no scripts (and whose calls' keys lie in different
    slots), the calls side by side. The first error raised is raised."""
    if not calls:
        return []
    if is_cluster(redis):
        return list(await asyncio.gather(*(script(keys=k, args=a) for k, a in calls)))
    sha = await commands(redis).script_load(script.script)
    async with commands(redis).pipeline(transaction=False) as pipe:
        for keys, args in calls:
            pipe.evalsha(sha, len(keys), *keys, *args)
        return list(await pipe.execute())
