"""The master of a Redis Sentinel set, found again after each failover.

``redis+sentinel://[USER:PASS@]HOST:PORT[,HOST:PORT…]/MASTER[/DB][?OPTIONS]`` names the
Sentinels (any number; one that answers is enough), the master's name as the Sentinels
know it, and the database. ``rediss+sentinel://`` speaks TLS, to the Sentinels and to the
servers alike. ``USER:PASS`` are the data servers' credentials; the options are:

* ``sentinel_username``, ``sentinel_password``: the Sentinels' own credentials (Sentinels
  have their own ``requirepass``/ACL);
* ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
  ``ssl_check_hostname``: TLS, as for ``rediss://``.

The client's pool (:class:`~broker.compat.redis.BlockingSentinelPool`) asks the Sentinels
for the master's address, and its :class:`~.sentinel_follow.SwitchFollower` moves every
connection to the new master as soon as the Sentinels switch (their ``+switch-master``,
and a poll every second); a master that turned into a replica (its ``READONLY`` reply)
drops the connection too, as redis-py does. Commands whose connection was closed are tried
again on a fresh one (the client's ``retry``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from ..compat.redis import (
    BlockingSentinelPool,
    FollowingSentinelConnection,
    FollowingSentinelSSLConnection,
)
from .sentinel_follow import SwitchFollower
from .urls import SENTINEL_SCHEMES, masked_url

SENTINEL_TIMEOUT = 1.0
"""Seconds a Sentinel has to answer (a stalled one is skipped for the next)."""

_TLS_OPTIONS = {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"}
_OPTIONS = {"sentinel_username", "sentinel_password", "ssl_check_hostname", *_TLS_OPTIONS}


@dataclass(frozen=True)
class SentinelAddress:
    """What a ``redis+sentinel://`` URL says."""

    sentinels: list[tuple[str, int]]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    sentinel_credentials: dict[str, str] = field(default_factory=dict)
    tls_options: dict[str, Any] = field(default_factory=dict)


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The parts of a Sentinel URL; ValueError (the URL masked) saying what is wrong."""
    scheme, _, rest = url.partition("://")
    if scheme not in SENTINEL_SCHEMES:
        raise ValueError(f"not a Sentinel URL: {masked_url(url)}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    sentinels = [_host_port(item, url) for item in netloc.split(",") if item]
    if not sentinels:
        raise ValueError(f"a Sentinel URL names at least one HOST:PORT: {masked_url(url)}")
    parts = [unquote(part) for part in path.split("/") if part]
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(
            "a Sentinel URL ends with /MASTER_NAME or /MASTER_NAME/DB: " + masked_url(url)
        )
    options = dict(parse_qsl(query))
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown option {', '.join(unknown)} in the store URL {masked_url(url)} "
            f"(known: {', '.join(sorted(_OPTIONS))})"
        )
    tls: dict[str, Any] = {name: value for name, value in options.items() if name in _TLS_OPTIONS}
    if "ssl_check_hostname" in options:
        tls["ssl_check_hostname"] = options["ssl_check_hostname"].lower() in ("1", "true", "yes")
    credentials = {
        name.removeprefix("sentinel_"): value
        for name, value in options.items()
        if name in ("sentinel_username", "sentinel_password")
    }
    return SentinelAddress(
        sentinels=sentinels,
        master=parts[0],
        db=int(parts[1]) if len(parts) == 2 else 0,
        username=username,
        password=password,
        tls=SENTINEL_SCHEMES[scheme],
        sentinel_credentials=credentials,
        tls_options=tls,
    )


def _host_port(item: str, url: str) -> tuple[str, int]:
    host, colon, port = item.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise ValueError(f"a Sentinel is named HOST:PORT, not {item!r}: {masked_url(url)}")
    return host.strip("[]"), int(port)


def sentinel_master(
    url: str,
    *,
    timeout: float,
    retry: Retry,
    pool_size: int,
    pool_wait: float,
    packed: Callable[[type[AbstractConnection]], type[AbstractConnection]],
) -> Redis:
    """A client of the master that the Sentinels of ``url`` name, decoding to str; its
    connections' class is ``packed(redis-py's)``."""
    address = parse_sentinel_url(url)
    tls: dict[str, Any] = dict(address.tls_options) if address.tls else {}
    if address.tls:
        tls["ssl"] = True
    quick = min(timeout, SENTINEL_TIMEOUT)
    sentinels = Sentinel(
        address.sentinels,
        sentinel_kwargs={
            "socket_timeout": quick,
            "socket_connect_timeout": quick,
            # Each Sentinel asked once a discovery (the client's own retry asks again):
            # redis-py's default retries made a wrong password fail after 30 s.
            "retry": Retry(NoBackoff(), 0),
            **address.sentinel_credentials,
            **tls,
        },
    )
    kind = FollowingSentinelSSLConnection if address.tls else FollowingSentinelConnection
    client: Redis = sentinels.master_for(
        address.master,
        connection_pool_class=BlockingSentinelPool,
        connection_class=packed(kind),
        decode_responses=True,
        db=address.db,
        username=address.username,
        password=address.password,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=30,
        max_connections=pool_size,
        timeout=pool_wait,
        retry=retry,
        **address.tls_options,
    )
    pool = client.connection_pool
    assert isinstance(pool, BlockingSentinelPool)
    pool.follower = SwitchFollower(sentinels.sentinels, address.master)
    return client
