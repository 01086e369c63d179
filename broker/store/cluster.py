"""Redis Cluster: the client, and sharded pub/sub following a channel whose slot moved.

redis-py's cluster client follows MOVED and ASK by itself, and its ``ClusterPubSub`` moves
a shard channel's subscription to the slot's new owner whenever the client's slot map
changes. Two of its habits hurt a broker under resharding, and are changed here:

- Every fifth MOVED (``reinitialize_steps``) it closes *every* connection of every node to
  reload the slot map, those in use by other commands and pub/sub readers included: their
  commands fail (``AttributeError: 'NoneType' object has no attribute 'writelines'`` on a
  connection closed under a write) and every subscription drops. Here a MOVED patches the
  slot map for its one slot, which also moves the subscriptions of that slot.
- On CLUSTERDOWN, or a connection error in a pipeline, it calls its own ``aclose()`` to
  reload the slot map: the same closing of every connection. Here a close redis-py asks for
  itself only marks the slot map for a reload (:meth:`PatientCluster.aclose`); a close the
  broker asks for (stopping) closes.
- A subscription sent to a slot's old owner gets a MOVED *reply*, read by whoever reads
  the subscription's messages, and then nothing: no command went through the client, so
  its slot map never learns. :func:`follow_redirect` teaches it the new owner, which moves
  the subscription. (Redis 7 also tells a shard channel's subscribers, with an
  ``sunsubscribe`` message, when its slot leaves the node: the hub subscribes again.)
"""

from __future__ import annotations

import sys
from typing import Any

from redis.asyncio import RedisCluster
from redis.exceptions import MovedError

from .retry import STORE_MOVING, retrying

REINITIALIZE_STEPS = 0
"""MOVED errors between two full reloads of the slot map (and closes of every connection):
never; a MOVED patches its slot (``NodesManager.move_slot``), a connection error reloads."""


def cluster_client(url: str, *, patience: float, **options: Any) -> RedisCluster:
    """A cluster client for ``url`` (``redis://`` or ``rediss://`` naming any node), with
    ``options`` as ``RedisCluster.from_url`` takes them; a command the cluster did not run
    because it is moving slots or failing over is tried again for ``patience`` seconds."""
    client = PatientCluster.from_url(url, reinitialize_steps=REINITIALIZE_STEPS, **options)
    assert isinstance(client, PatientCluster)
    client.patience = patience
    return client


class PatientCluster(RedisCluster):
    """A cluster client whose commands (scripts included: ``EVALSHA``, ``FCALL``) are tried
    again, with a growing pause, while the cluster answers that it did not run them
    (:data:`~.retry.STORE_MOVING`): redis-py gives up after 16 redirections or TRYAGAINs
    in a row, about half a second, where a slot's migration, key by key, takes longer. The
    caller's own deadline still bounds the wait (it cancels). Pipelines are not tried
    again here: part of one may have run; their callers retry them whole, or read again."""

    patience: float = 5.0
    """Seconds a command is tried again while the cluster is moving (the command timeout)."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        once = super().execute_command
        return await retrying(lambda: once(*args, **kwargs), self.patience, STORE_MOVING)

    async def aclose(self) -> None:
        """Close every connection; but when redis-py itself asks, from inside a command or
        a pipeline that met CLUSTERDOWN or a lost connection, only have the slot map
        reloaded before the next command: closing would cut the connections other commands
        and the pub/sub readers are using at that moment."""
        if _called_by_redis_py_for_a_reload():
            self._initialize = True  # the client's own flag: reload the map, then go on
            return
        await super().aclose()


_RELOADERS = frozenset({"_execute_command", "execute"})
"""redis-py's cluster functions that call ``aclose()`` to reload the slot map (a command's,
a pipeline's); ``tests/test_store_cluster.py`` checks that they still do."""


def _called_by_redis_py_for_a_reload() -> bool:
    caller = sys._getframe(2)  # 0: this function, 1: aclose, 2: whoever called aclose
    return caller.f_code.co_name in _RELOADERS and caller.f_globals.get("__name__") == (
        RedisCluster.__module__
    )


async def follow_redirect(redis: RedisCluster, exc: BaseException) -> bool:
    """When ``exc`` is a MOVED that reached a pub/sub reader, patch the slot map of
    ``redis`` with the node it names (as the client does for its own commands), so that its
    pub/sub moves the slot's subscriptions there; whether it was one. (A slot being migrated
    serves its shard channels from its old node until it has moved: no ASK for them.)"""
    if not isinstance(exc, MovedError):
        return False
    # ``nodes_manager`` is the client's public attribute holding its slot map; ``move_slot``
    # is what the client itself calls on a MOVED, and it notifies the pub/sub objects.
    await redis.nodes_manager.move_slot(exc)
    return True
