"""Connecting to the store: a real Redis (single or Cluster) or the embedded one.

The embedded store is fakeredis with Lua, in this process: the same commands,
the same scripts, the same code path, but single-node and not durable.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fakeredis
from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError

from .cluster import cluster_client

log = logging.getLogger(__name__)

Store = Any
"""A ``redis.asyncio.Redis`` or ``RedisCluster`` (or a fakeredis stand-in), decoding to str."""

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
POOL_SIZE = 64
"""Redis connections per process. A burst of requests past it waits for a free connection
(up to :data:`POOL_WAIT` seconds) instead of failing with "Too many connections"."""
POOL_WAIT = 20.0


COMMAND_TIMEOUT = 5.0
"""Seconds a Redis command may take (the setting ``redis_timeout``): a stalled server fails
the command instead of hanging its caller."""
RECONNECT_RETRIES = 2
"""A command whose connection turns out dead (the server restarted since it was last used) is
sent again on a fresh connection, at most this many times, after a short backoff."""


def connect(url: str | None, *, timeout: float = COMMAND_TIMEOUT) -> Store:
    """A client for ``url``, or for a new embedded store when ``url`` is None.

    ``redis+cluster://HOST:PORT`` (or ``rediss+cluster://``) names any node of a Redis
    Cluster; the client discovers the rest and follows MOVED/ASK and failovers. ``timeout``
    bounds each command and each connection attempt.
    """
    if url is None:
        return fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    scheme, sep, rest = url.partition("://")
    bounded = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if sep and scheme in CLUSTER_SCHEMES:
        return cluster_client(
            f"{CLUSTER_SCHEMES[scheme]}://{rest}",
            patience=timeout,
            decode_responses=True,
            health_check_interval=30,
            **bounded,
        )
    # Only connection errors are retried: a timeout may hide a command that did run.
    retry = Retry(
        ExponentialBackoff(cap=0.5, base=0.05), RECONNECT_RETRIES, (RedisConnectionError,)
    )
    pool = BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        health_check_interval=30,
        max_connections=POOL_SIZE,
        timeout=POOL_WAIT,
        retry=retry,
        **bounded,
    )
    pool.connection_class = packed_by_hiredis(pool.connection_class)
    return Redis.from_pool(pool)


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


def masked_url(url: str | None) -> str:
    """A store URL fit for a log: its password replaced by ``***`` ("embedded" for None)."""
    if url is None:
        return "embedded (in-process, not durable)"
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.hostname or ""
    netloc = f"{user}***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def is_cluster(redis: Store) -> bool:
    """Whether keys of different slots must be read separately (Redis Cluster)."""
    return isinstance(redis, RedisCluster)


def is_single_server(redis: Store) -> bool:
    """Whether ``redis`` is a client of one real Redis server (not a cluster, not embedded):
    what the front's own connections (``subscriber``, ``direct``) can talk to."""
    return isinstance(redis, Redis) and not isinstance(redis, fakeredis.FakeAsyncRedis)


def embedded_warning() -> str:
    """What ``serve`` says when it runs on the embedded store."""
    return (
        "no Redis URL configured: using the embedded in-process store. It is single-node and "
        "NOT durable: every session is lost when this process stops. Set --redis-url "
        "(or ACP_BROKER_REDIS_URL) for anything but a demo."
    )
