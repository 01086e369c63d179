"""redis-py's internals the broker relies on, in one place: commands packed by hiredis,
and a cluster client that reloads its slot map without cutting the connections in use.

:func:`packed_by_hiredis` mixes into a pool's ``connection_class`` an override of
``AbstractConnection.pack_command`` (redis-py's asyncio connections pack in Python) using
``redis.connection.HiredisRespSerializer`` (redis-py's synchronous client's packer); both
are redis-py internals. ``tests/test_compat_redis.py`` checks that the override packs the
bytes redis-py's own packer makes, so an upgrade that changes either fails there by name.
"""

from __future__ import annotations

import sys
from typing import Any

from redis.asyncio import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.connection import HiredisRespSerializer
from redis.exceptions import MovedError


class _HiredisPacking(AbstractConnection):
    """Commands packed by hiredis, in C, as redis-py's synchronous client packs them
    (``HiredisRespSerializer``, the same bytes); its asyncio client packs them in Python,
    which was 45% of an agent host's time appending events (cProfile of ``append_many``)."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)


_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def packed_by_hiredis(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` with its commands packed by hiredis."""
    if issubclass(connection_class, _HiredisPacking):
        return connection_class
    if connection_class not in _PACKED:
        name = f"Hiredis{connection_class.__name__}"
        _PACKED[connection_class] = type(name, (_HiredisPacking, connection_class), {})
    return _PACKED[connection_class]


class ReloadingCluster(RedisCluster):
    """A cluster client whose ``aclose()``, when redis-py itself calls it to reload the slot
    map (a command's or a pipeline's CLUSTERDOWN, a lost connection in a pipeline), only has
    the map reloaded before the next command: redis-py's own close cuts every connection of
    every node, those other commands and the pub/sub readers use at that moment included
    (``AttributeError: 'NoneType' object has no attribute 'writelines'`` on a connection
    closed under a write). A close the broker asks for (stopping) closes. Leans on
    redis-py's ``_initialize`` flag and on the names of the functions that call ``aclose``
    for a reload (:data:`RELOADERS`); ``tests/test_compat_redis.py`` checks both."""

    async def aclose(self) -> None:
        if _called_by_redis_py_for_a_reload():
            self._initialize = True  # the client's own flag: reload the map, then go on
            return
        await super().aclose()


RELOADERS = frozenset({"_execute_command", "execute"})
"""redis-py's cluster functions that call ``aclose()`` to reload the slot map (a command's,
a pipeline's)."""


def _called_by_redis_py_for_a_reload() -> bool:
    caller = sys._getframe(2)  # 0: this function, 1: aclose, 2: whoever called aclose
    return caller.f_code.co_name in RELOADERS and caller.f_globals.get("__name__") == (
        RedisCluster.__module__
    )


async def follow_redirect(redis: RedisCluster, exc: BaseException) -> bool:
    """When ``exc`` is a MOVED that reached a pub/sub reader, patch the slot map of
    ``redis`` with the node it names (as the client does for its own commands), so that its
    pub/sub moves the slot's subscriptions there; whether it was one. (A slot being migrated
    serves its shard channels from its old node until it has moved: no ASK for them.)"""
    if not isinstance(exc, MovedError):
        return False
    # ``nodes_manager`` holds the client's slot map; ``move_slot`` is what the client itself
    # calls on a MOVED, and it notifies the pub/sub objects.
    await redis.nodes_manager.move_slot(exc)
    return True
