"""What a store failure means, in one line an operator can act on.

The same words serve the start-up checks (:mod:`.preflight`), readiness (:mod:`.readiness`)
and the logs: a replica that refuses writes, a missing ACL permission, a full Redis, a
master being replaced, a plain connection to a TLS port, a private CA not trusted.
"""

from __future__ import annotations

import re
import ssl

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import (
    AuthenticationError,
    NoPermissionError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors.failures import describe
from .errors import StoreError, StoreForbidden, StoreReadOnly, StoreUnavailable
from .log_errors import is_oom

ACL_RULE = "on >PASSWORD ~acpb:* &acpb:* +@all -@dangerous"
"""The least-privilege ACL rule the broker needs (``ACL SETUSER NAME <this>``): its keys
and channels (all named ``acpb:…``), every command outside ``@dangerous``."""

_COMMAND = re.compile(r"permissions to run the '([^']+)' command")


def is_noperm(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a command to this ACL user."""
    return isinstance(exc, NoPermissionError | StoreForbidden) or (
        isinstance(exc, ResponseError) and str(exc).startswith("NOPERM")
    )


def missing_permission(exc: BaseException, command: str) -> str:
    """Which permission a ``NOPERM`` reply to ``command`` says is missing, and the fix."""
    text = str(exc)
    if "channel" in text:
        return (
            f"the Redis user may not use pub/sub channels ({command} was refused): give it "
            "'&*' (allchannels); Redis 7 gives new users no channel at all"
        )
    if "keys" in text or "key" in text:
        return f"the Redis user may not use the broker's keys ({command} was refused): give it '~*'"
    found = _COMMAND.search(text)
    name = found.group(1) if found else command.lower()
    return f"the Redis user may not run '{name}': give it '+{name}' (or '+@all -@dangerous')"


def write_problem(exc: BaseException) -> str:
    """Why a write to the store failed, as a reason for ``/readyz`` and the logs."""
    if isinstance(exc, ReadOnlyError | StoreReadOnly):
        return (
            "the store refuses writes: the server is a read-only replica (a failover "
            "demoted it; reach the master through redis+sentinel:// to follow failovers)"
        )
    if is_noperm(exc):
        return missing_permission(exc, "a write")
    if is_oom(exc):
        return (
            "store full: Redis reached maxmemory and refuses writes until space is freed "
            "(acp-broker archive), reads keep working"
        )
    if isinstance(exc, MasterNotFoundError):
        return f"the store is failing over: {no_master(exc)}"
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError | StoreUnavailable):
        return f"Redis cannot be reached ({describe(exc)}){connection_hint(exc)}"
    return f"the store refused a write: {describe(exc)}"


def connection_hint(exc: BaseException, *, tls: bool | None = None) -> str:
    """A hint for a connection that failed in a way that points at TLS; "" otherwise.

    ``tls``: whether the URL asked for TLS (None: unknown)."""
    text = str(exc)
    causes = [exc, exc.__cause__, exc.__context__]
    if any(isinstance(cause, ssl.SSLCertVerificationError) for cause in causes) or (
        "CERTIFICATE_VERIFY_FAILED" in text
    ):
        return (
            "; the server's certificate is not trusted: name your private CA with "
            "?ssl_ca_certs=/path/to/ca.crt"
        )
    if tls is not True and (
        "Connection reset by peer" in text
        or "Connection closed by server" in text
        or "wrong version number" in text
    ):
        return (
            "; the server closed the connection at once: if it serves TLS, use rediss:// "
            "instead of redis://"
        )
    return ""


def no_master(exc: BaseException) -> str:
    """A Sentinel's "no master" failure without redis-py's dump of every Sentinel client."""
    return f"{type(exc).__name__}: {str(exc).split(' : ', 1)[0]}"


def brief(exc: BaseException) -> str:
    """:func:`~broker.errors.failures.describe`, short for a Sentinel's "no master" failure;
    a port's error in the client's words (its cause: what a client was always told)."""
    if isinstance(exc, StoreError) and isinstance(exc.__cause__, RedisError):
        exc = exc.__cause__
    return no_master(exc) if isinstance(exc, MasterNotFoundError) else describe(exc)


def start_problem(exc: BaseException, *, tls: bool) -> str:
    """Why the store could not be used at start-up, and the fix where there is one."""
    if isinstance(exc, MasterNotFoundError):
        return (
            f"cannot reach the store: {no_master(exc)}: no Sentinel answered with a master "
            "of that name; check the name, that the Sentinels are reachable, and their "
            f"own credentials (?sentinel_password=){connection_hint(exc, tls=tls)}"
        )
    if isinstance(exc, AuthenticationError):
        return f"the store refused the credentials: {describe(exc)}"
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError | StoreUnavailable):
        return f"cannot reach the store: {describe(exc)}{connection_hint(exc, tls=tls)}"
    if isinstance(exc, RedisError | StoreError):
        return write_problem(exc)
    return describe(exc)
