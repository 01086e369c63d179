"""redis-py's internals the broker relies on, in one place: commands packed by hiredis.

:func:`packed_by_hiredis` mixes into a pool's ``connection_class`` an override of
``AbstractConnection.pack_command`` (redis-py's asyncio connections pack in Python) using
``redis.connection.HiredisRespSerializer`` (redis-py's synchronous client's packer); both
are redis-py internals. ``tests/test_compat_redis.py`` checks that the override packs the
bytes redis-py's own packer makes, so an upgrade that changes either fails there by name.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.connection import HiredisRespSerializer


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
