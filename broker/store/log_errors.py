"""What the session log's operations raise, and how an append script's error reply maps
to them."""

from __future__ import annotations

from redis.exceptions import OutOfMemoryError, ResponseError

from .errors import StoreFullError


class SessionMissing(LookupError):
    """No session with this id in this tenant (or it belongs to another tenant)."""


class SessionExists(Exception):
    """A session with this id already exists."""


class Fenced(Exception):
    """The appender's fencing token is stale: another agent host holds the session."""


class SessionArchived(Exception):
    """The session's log is in the archive store (the append script refuses until restored)."""


class SessionFull(Exception):
    """The session has as many events as ``max_events_per_session`` allows."""


class StoreFull(Exception):
    """Redis refused a write: it is at ``maxmemory`` (run it with ``noeviction``)."""


class ArchiveUnavailable(Exception):
    """The session's log is archived, and this process has no archive store to read it."""


def is_oom(exc: BaseException) -> bool:
    """Whether Redis refused a command because it is at ``maxmemory``."""
    # redis-py raises OutOfMemoryError for a plain command; a script's error keeps the text.
    return isinstance(exc, OutOfMemoryError | StoreFullError) or (
        isinstance(exc, ResponseError) and "OOM" in str(exc) and "maxmemory" in str(exc)
    )


def append_error(exc: ResponseError) -> Exception:
    text = str(exc)
    if is_oom(exc):
        return StoreFull(text)
    if "ARCHIVED" in text:
        return SessionArchived(text)
    if "LIMIT" in text:
        return SessionFull(text)
    if "NOSESSION" in text:
        return SessionMissing(text)
    if "EXISTS" in text:
        return SessionExists(text)
    if "FENCED" in text:
        return Fenced(text)
    return exc
