"""One connection for a front's hottest read, past redis-py's client layers.

``session/list`` makes one script call a page. Through redis-py's client that call
crosses the connection pool (a lock, a condition, a timeout), a retry wrapper and an
event dispatcher on its way out and back: 73 µs of CPU a call, where a bare connection
spends 30 (``python -m bench requests``). :class:`DirectCalls` holds one of the pool's own
connections (redis-py's, with its authentication, TLS and reply parsing) and sends one
command at a time on it. When anything goes wrong (a cut connection, a script Redis does
not know yet) the caller makes the call again through the client, which knows how to
recover; the connection starts afresh on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .client import is_single_server


def direct_calls(redis: Any) -> DirectCalls | None:
    """A :class:`DirectCalls` for a single Redis server; None for a cluster or the embedded
    store (which keep the client's path)."""
    if is_single_server(redis):
        return DirectCalls(redis)
    return None


class DirectCalls:
    """Script calls on a connection of the store's pool that this object keeps."""

    def __init__(self, redis: Redis) -> None:
        self._pool = redis.connection_pool
        self._connection: Any = None
        self._lock = asyncio.Lock()

    async def evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The script's reply. Raises what the call raised (a ``NoScriptError`` among them:
        the caller then goes through the client, which loads the script)."""
        async with self._lock:
            connection = self._connection
            if connection is None:
                # Taken from the pool for good: the pool still closes it with the store.
                connection = self._connection = await self._pool.get_connection()
            command = connection.pack_command("EVALSHA", sha, len(keys), *keys, *args)
            try:
                await connection.send_packed_command(command, check_health=False)
                return await connection.read_response()
            except ResponseError:
                raise  # an error reply: the connection is in step
            except BaseException:
                # Cut, timed out or cancelled half-way: a reply may still be on its way,
                # so this connection is out of step; the next call opens it again.
                with contextlib.suppress(Exception):
                    await connection.disconnect(nowait=True)
                raise
