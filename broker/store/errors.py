"""The store's failures as the roles catch them: the project's own classes, whichever client
library raised them.

A role never sees a Redis client's exception classes. Every port (the session log, the
index, the command bus, leases …) is marked with :func:`~.boundary.port` (a class) or
:func:`~.boundary.translated` (a function): a client library's error leaving it is raised
again as one of the classes here, the library's error as its ``__cause__``. A role catches
:class:`StoreError` (any failure the store reports) or the kind it must tell apart:

- :class:`StoreUnavailable`: out of reach for now (restarting, stalled, failing over, slots
  moving): "try again". Its kinds: :class:`StoreConnectionLost` (the connection a command
  went on broke: a fresh one may serve it), :class:`StoreAway` (not sent: the breaker knows
  the store is away), :class:`StoreReadOnly` (a replica refused the write: a failover
  demoted the server).
- :class:`StoreFullError`: Redis at ``maxmemory`` refused a write.
- :class:`StoreForbidden`: the Redis user may not run the command (``NOPERM``).
- :class:`StoreReplyError`: any other error reply (its text is the reply's).

Inside :mod:`broker.store` the client's own classes go on flowing (its scripts and retries
rely on them); the predicates here and in :mod:`.retry`, :mod:`.faults` and :mod:`.log_errors`
accept both. What each failure tells a client is :mod:`broker.errors.store`'s.
"""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


class StoreError(Exception):
    """Any failure a store command reports (out of reach, refused, an error reply): what a
    role catches around a port's call."""


class StoreUnavailable(StoreError):
    """The store is out of reach for now (a restart, a stall, a failover, a cluster moving
    slots): the command may be tried again."""


class StoreConnectionLost(StoreUnavailable):
    """The connection the command went on was lost: a fresh one may serve it."""


class StoreReadOnly(StoreUnavailable):
    """The server refused a write as a read-only replica (a failover demoted it)."""


class StoreAway(StoreUnavailable, RedisConnectionError):
    """A command not sent: the store is known to be away (see
    :class:`~.breaker.StoreBreaker`). Raised inside the client's connection, so it is also
    the client's connection error there (the client then drops the command as it drops one
    on a broken connection); a role sees a :class:`StoreUnavailable`."""


class StoreFullError(StoreError):
    """Redis refused a write: it is at ``maxmemory``."""


class StoreForbidden(StoreError):
    """The Redis user may not run the command, or use its keys or channels (``NOPERM``)."""


class StoreReplyError(StoreError):
    """An error reply to a command (its text is the reply's)."""


def group_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says a stream's consumer group does not exist (Redis came back
    empty: the group went with its stream)."""
    return _reply(exc) and "NOGROUP" in str(exc)


def group_exists(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing to create a consumer group that exists already."""
    return _reply(exc) and "BUSYGROUP" in str(exc)


def no_session(exc: BaseException) -> bool:
    """Whether ``exc`` is a store script's ``NOSESSION`` refusal (no such session)."""
    return _reply(exc) and "NOSESSION" in str(exc)


def _reply(exc: BaseException) -> bool:
    return isinstance(exc, ResponseError | StoreReplyError)


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection a command went on was lost (a fresh one may
    serve it), rather than the breaker refusing it while the store is away, a stall's
    timeout or an error reply."""
    if isinstance(exc, StoreAway):
        return False
    return isinstance(exc, StoreConnectionLost | RedisConnectionError)
