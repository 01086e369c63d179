"""The store's failures as the roles catch them: the project's names, whichever client
library raised them.

A role never names a Redis client's exception classes: it catches :data:`StoreError` (any
failure the store reports: out of reach, refused, a bad reply), and asks the functions here
what a failure means. What each failure tells a client is :mod:`broker.errors.store`'s.
"""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from .breaker import StoreAway

StoreError = RedisError
"""Any failure a store command reports (out of reach, refused, an error reply): what a role
catches around a port's call. (The store raises the client's own classes; this name is the
one place a role reaches them.)"""


def group_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says a stream's consumer group does not exist (Redis came back
    empty: the group went with its stream)."""
    return isinstance(exc, ResponseError) and "NOGROUP" in str(exc)


def group_exists(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing to create a consumer group that exists already."""
    return isinstance(exc, ResponseError) and "BUSYGROUP" in str(exc)


def no_session(exc: BaseException) -> bool:
    """Whether ``exc`` is a store script's ``NOSESSION`` refusal (no such session)."""
    return isinstance(exc, ResponseError) and "NOSESSION" in str(exc)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection a command went on was lost (a fresh one may
    serve it), rather than the breaker refusing it while the store is away, a stall's
    timeout or an error reply."""
    return isinstance(exc, RedisConnectionError) and not isinstance(exc, StoreAway)
