"""Connecting to the store: a real Redis (one server, a Sentinel set or a Cluster) or the
embedded one.

The embedded store is fakeredis with Lua, in this process: the same commands,
the same scripts, the same code path, but single-node and not durable.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any, Protocol, cast

import fakeredis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from ..compat.redis import GatedPool, PausesBackoff, gated
from ..compat.redis import packed_by_hiredis as packed_by_hiredis  # found here by callers
from ..retry import doubling_pause
from .breaker import StoreBreaker
from .cluster import patient_cluster
from .connections import RECONNECT_FIRST_PAUSE, RECONNECT_MAX_PAUSE, RECONNECT_RETRIES
from .own_client import OwnClient
from .sentinel import sentinel_master
from .urls import SENTINEL_SCHEMES, tls_files_exist
from .urls import masked_url as masked_url  # where callers have long found it

log = logging.getLogger(__name__)


class Store(Protocol):
    """An open store, as :func:`connect` makes it (one server, a Sentinel master, a Redis
    Cluster or the embedded store): what the roles hold and hand to the store's ports, whose
    typed methods are all a role can do with it (the session log, the index, the live feed,
    the command bus, leases and the host registry, idempotency and token records, rate
    counters, the retention sets and the archive: see ``docs/storage.md``). The commands
    behind it are the ports' own (:class:`Commands`)."""

    async def aclose(self) -> None: ...


class Commands(Store, Protocol):
    """The client behind a :class:`Store`, as the store's own modules send it commands:
    the log's streams and scripts, the index's sorted sets and hashes, the queues' streams
    and consumer groups, leases, the live feed's sharded pub/sub, pipelines and scripts.
    Every client :func:`connect` makes is one (redis-py's ``Redis``, ``RedisCluster``,
    fakeredis's); nothing outside ``broker/store`` uses it (``tests/test_layout.py``).

    The commands' arguments and replies keep redis-py's own (loose) types: the ports'
    signatures are where the types are precise."""

    def get(self, *args: Any, **kwargs: Any) -> Any: ...

    def set(self, *args: Any, **kwargs: Any) -> Any: ...

    def delete(self, *args: Any, **kwargs: Any) -> Any: ...

    def exists(self, *args: Any, **kwargs: Any) -> Any: ...

    def expire(self, *args: Any, **kwargs: Any) -> Any: ...

    def pexpire(self, *args: Any, **kwargs: Any) -> Any: ...

    def incrby(self, *args: Any, **kwargs: Any) -> Any: ...

    def hget(self, *args: Any, **kwargs: Any) -> Any: ...

    def hset(self, *args: Any, **kwargs: Any) -> Any: ...

    def hincrby(self, *args: Any, **kwargs: Any) -> Any: ...

    def hmget(self, *args: Any, **kwargs: Any) -> Any: ...

    def hgetall(self, *args: Any, **kwargs: Any) -> Any: ...

    def hexists(self, *args: Any, **kwargs: Any) -> Any: ...

    def hkeys(self, *args: Any, **kwargs: Any) -> Any: ...

    def hlen(self, *args: Any, **kwargs: Any) -> Any: ...

    def hdel(self, *args: Any, **kwargs: Any) -> Any: ...

    def zadd(self, *args: Any, **kwargs: Any) -> Any: ...

    def zrem(self, *args: Any, **kwargs: Any) -> Any: ...

    def zrange(self, *args: Any, **kwargs: Any) -> Any: ...

    def zrangebyscore(self, *args: Any, **kwargs: Any) -> Any: ...

    def zrevrange(self, *args: Any, **kwargs: Any) -> Any: ...

    def zcard(self, *args: Any, **kwargs: Any) -> Any: ...

    def zcount(self, *args: Any, **kwargs: Any) -> Any: ...

    def zscore(self, *args: Any, **kwargs: Any) -> Any: ...

    def sadd(self, *args: Any, **kwargs: Any) -> Any: ...

    def srem(self, *args: Any, **kwargs: Any) -> Any: ...

    def smembers(self, *args: Any, **kwargs: Any) -> Any: ...

    def xadd(self, *args: Any, **kwargs: Any) -> Any: ...

    def xrange(self, *args: Any, **kwargs: Any) -> Any: ...

    def xrevrange(self, *args: Any, **kwargs: Any) -> Any: ...

    def xread(self, *args: Any, **kwargs: Any) -> Any: ...

    def xreadgroup(self, *args: Any, **kwargs: Any) -> Any: ...

    def xgroup_create(self, *args: Any, **kwargs: Any) -> Any: ...

    def xack(self, *args: Any, **kwargs: Any) -> Any: ...

    def xtrim(self, *args: Any, **kwargs: Any) -> Any: ...

    def xautoclaim(self, *args: Any, **kwargs: Any) -> Any: ...

    def xpending(self, *args: Any, **kwargs: Any) -> Any: ...

    def xpending_range(self, *args: Any, **kwargs: Any) -> Any: ...

    def xlen(self, *args: Any, **kwargs: Any) -> Any: ...

    def xinfo_stream(self, *args: Any, **kwargs: Any) -> Any: ...

    def spublish(self, *args: Any, **kwargs: Any) -> Any: ...

    def publish(self, *args: Any, **kwargs: Any) -> Any: ...

    def eval(self, *args: Any, **kwargs: Any) -> Any: ...

    def evalsha(self, *args: Any, **kwargs: Any) -> Any: ...

    def script_load(self, *args: Any, **kwargs: Any) -> Any: ...

    def scan_iter(self, *args: Any, **kwargs: Any) -> Any: ...

    def ping(self, *args: Any, **kwargs: Any) -> Any: ...

    def info(self, *args: Any, **kwargs: Any) -> Any: ...

    def config_get(self, *args: Any, **kwargs: Any) -> Any: ...

    def execute_command(self, *args: Any, **kwargs: Any) -> Any: ...

    def pipeline(self, *args: Any, **kwargs: Any) -> Any: ...

    def pubsub(self, *args: Any, **kwargs: Any) -> Any: ...

    def register_script(self, script: str) -> Any: ...

    async def aclose(self) -> None: ...


def commands(store: Store) -> Commands:
    """The client behind ``store``, to send it commands (what every client :func:`connect`
    makes is)."""
    return cast(Commands, store)


CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
POOL_SIZE = 64
"""Redis connections per process. A burst of requests past it waits for a free connection
(up to :data:`POOL_WAIT` seconds) instead of failing with "Too many connections"."""
POOL_WAIT = 20.0
EMBEDDED_POOL = 1 << 20
"""Connections of the embedded store's pool: no bound in effect (each is an object in this
process, no socket). redis-py's default of 100 failed the 101st request at once ("Too many
connections"): a pipelining client has 256 in flight."""


COMMAND_TIMEOUT = 5.0
"""Seconds a Redis command may take (the setting ``redis_timeout``): a stalled server fails
the command instead of hanging its caller."""


def connect(url: str | None, *, timeout: float = COMMAND_TIMEOUT) -> Store:
    """A client for ``url``, or for a new embedded store when ``url`` is None: the one place
    that decides the store's topology (:func:`topology` tells it afterwards).

    * ``redis://`` / ``rediss://`` (TLS) / ``unix://``: one Redis server;
    * ``redis+cluster://HOST:PORT`` (or ``rediss+cluster://``) names any node of a Redis
      Cluster; the client discovers the rest and follows MOVED/ASK and failovers;
    * ``redis+sentinel://[USER:PASS@]HOST:PORT[,HOST:PORT…]/MASTER[/DB]`` (or
      ``rediss+sentinel://``): the master that the Sentinels name, found again after a
      failover (see :mod:`.sentinel`).

    ``timeout`` bounds each command and each connection attempt. A TLS file the URL names
    (``ssl_ca_certs`` …) that does not exist is refused here, by name.
    """
    if url is None:
        return fakeredis.FakeAsyncRedis(
            server=fakeredis.FakeServer(), decode_responses=True, max_connections=EMBEDDED_POOL
        )
    tls_files_exist(url)
    scheme, sep, rest = url.partition("://")
    bounded = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    breaker = StoreBreaker()  # see guard.StoreGuard: its probe opens and closes it
    if sep and scheme in CLUSTER_SCHEMES:
        return patient_cluster(
            f"{CLUSTER_SCHEMES[scheme]}://{rest}",
            patience=timeout,
            gate=breaker,
            decode_responses=True,
            health_check_interval=30,
            **bounded,
        )
    if sep and scheme in SENTINEL_SCHEMES:
        master = sentinel_master(
            url,
            timeout=timeout,
            retry=_reconnecting(),
            pool_size=POOL_SIZE,
            pool_wait=POOL_WAIT,
            packed=lambda kind: gated(packed_by_hiredis(kind), breaker),
        )
        pool = master.connection_pool
        assert isinstance(pool, GatedPool)  # sentinel_master's BlockingSentinelPool
        pool.gate = breaker
        return master
    own = own_connections_reach(url)
    pool = GatedPool.from_url(
        url,
        decode_responses=True,
        health_check_interval=30,
        max_connections=POOL_SIZE,
        timeout=POOL_WAIT,
        retry=_reconnecting(),
        **({"protocol": 2} if own else {}),
        **bounded,
    )
    pool.connection_class = gated(packed_by_hiredis(pool.connection_class), breaker)
    pool.gate = breaker
    if own:
        return OwnClient.over(pool, breaker, size=POOL_SIZE, wait=POOL_WAIT)
    return Redis.from_pool(pool)


def own_connections_reach(url: str) -> bool:
    """Whether the store's own connections (:mod:`.own_client`) carry every command to the
    one server ``url`` names: over plain TCP or a Unix socket (TLS is redis-py's)."""
    return url.partition("://")[0] in ("redis", "unix")


def _reconnecting() -> Retry:
    """Commands tried again on a fresh connection after a connection error (only those: a
    timeout may hide a command that did run): redis-py's retry, with the pauses of the
    code base's one retry helper (:func:`broker.retry.doubling_pause`)."""
    backoff = PausesBackoff(
        lambda failures: doubling_pause(failures, RECONNECT_FIRST_PAUSE, RECONNECT_MAX_PAUSE)
    )
    return Retry(backoff, RECONNECT_RETRIES, (RedisConnectionError,))


class Topology(StrEnum):
    """How the store is laid out: what :func:`connect` decided from the URL."""

    EMBEDDED = "embedded"
    """fakeredis in this process."""
    STANDALONE = "standalone"
    """One Redis server, reached at its own address."""
    SENTINEL = "sentinel"
    """The master a set of Sentinels names (it moves on a failover)."""
    CLUSTER = "cluster"
    """A Redis Cluster: keys of different slots live on different nodes."""


def topology(redis: Store) -> Topology:
    """The topology of a client :func:`connect` made."""
    if isinstance(redis, fakeredis.FakeAsyncRedis):
        return Topology.EMBEDDED
    if isinstance(redis, RedisCluster):
        return Topology.CLUSTER
    if isinstance(getattr(redis, "connection_pool", None), SentinelConnectionPool):
        return Topology.SENTINEL
    return Topology.STANDALONE


def cluster_client(redis: Store) -> RedisCluster:
    """``redis`` as the Redis Cluster client it is, for what only a cluster has (its slot
    map, its nodes); TypeError for any other topology."""
    if not isinstance(redis, RedisCluster):
        raise TypeError(f"not a Redis Cluster client: {topology(redis)}")
    return redis


def server_client(redis: Store) -> Redis:
    """``redis`` as the client of one server it is (standalone, a Sentinel master, the
    embedded store), for its connection pool; TypeError for a cluster."""
    if not isinstance(redis, Redis):
        raise TypeError(f"not a client of one server: {topology(redis)}")
    return redis


def is_cluster(redis: Store) -> bool:
    """Whether keys of different slots must be read separately (Redis Cluster)."""
    return topology(redis) is Topology.CLUSTER


def embedded_warning() -> str:
    """What ``serve`` says when it runs on the embedded store."""
    return (
        "no Redis URL configured: using the embedded in-process store. It is single-node and "
        "NOT durable: every session is lost when this process stops. Set --redis-url "
        "(or ACP_BROKER_REDIS_URL) for anything but a demo."
    )
