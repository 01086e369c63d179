"""Redis Cluster: a client patient with a cluster that is moving slots or failing over.

redis-py's cluster client follows MOVED and ASK by itself, and its ``ClusterPubSub`` moves
a shard channel's subscription to the slot's new owner whenever the client's slot map
changes. Its habits that hurt a broker under resharding are changed here and in
:mod:`broker.compat.redis` (where the overrides of its internals live):

- It gives up after 16 redirections or TRYAGAINs in a row (about half a second), where a
  slot migrated key by key takes longer: :class:`PatientCluster` tries again.
- Every fifth MOVED (``reinitialize_steps``) it closes *every* connection of every node to
  reload the slot map: here a MOVED patches the slot map for its one slot (which also
  moves that slot's subscriptions). (On CLUSTERDOWN, or a connection error in a pipeline,
  redis-py 8.2 and later reload the map in place, closing nothing else: the pin's floor.)
- A subscription sent to a slot's old owner gets a MOVED *reply*, read by whoever reads
  the subscription's messages, and then nothing: :func:`follow_redirect` teaches the client
  the new owner, which moves the subscription. (Redis 7 also tells a shard channel's
  subscribers, with an ``sunsubscribe`` message, when its slot leaves the node: the hub
  subscribes again.)
- It asks the server (``COMMAND GETKEYS``) for the keys of every ``XREAD`` and
  ``XREADGROUP`` before sending it (twice in a pipeline): here its commands parser reads
  them from the command (:class:`~broker.compat.redis.StreamKeysCluster`).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import RedisCluster

from ..compat.redis import Gate, StreamKeysCluster
from ..compat.redis import follow_redirect as follow_redirect  # where the hub finds it
from .retry import STORE_MOVING, retrying

REINITIALIZE_STEPS = 0
"""MOVED errors between two full reloads of the slot map (and closes of every connection):
never; a MOVED patches its slot (``NodesManager.move_slot``), a connection error reloads."""


def patient_cluster(
    url: str, *, patience: float, gate: Gate | None = None, **options: Any
) -> RedisCluster:
    """A cluster client for ``url`` (``redis://`` or ``rediss://`` naming any node), with
    ``options`` as ``RedisCluster.from_url`` takes them; a command the cluster did not run
    because it is moving slots or failing over is tried again for ``patience`` seconds.
    With ``gate`` (the store's breaker), nothing is sent while it refuses commands."""
    client = PatientCluster.from_url(url, reinitialize_steps=REINITIALIZE_STEPS, **options)
    assert isinstance(client, PatientCluster)
    client.patience = patience
    if gate is not None:
        client.install_gate(gate)
    return client


class PatientCluster(StreamKeysCluster):
    """A cluster client whose commands (scripts included: ``EVALSHA``, ``FCALL``) are tried
    again, with a growing pause, while the cluster answers that it did not run them
    (:data:`~.retry.STORE_MOVING`). The caller's own deadline still bounds the wait (it
    cancels). Pipelines are not tried again here: part of one may have run; their callers
    retry them whole, or read again."""

    patience: float = 5.0
    """Seconds a command is tried again while the cluster is moving (the command timeout)."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        once = super().execute_command
        return await retrying(lambda: once(*args, **kwargs), self.patience, STORE_MOVING)
