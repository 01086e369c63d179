"""Errors and failure descriptions, in one place.

- this module: the error codes of the broker's HTTP API and MCP tools (:class:`ApiError`);
- :mod:`.failures`: failures an operator reads (:class:`~.failures.FailureLog`,
  :func:`~.failures.describe`);
- :mod:`.store`: what a store failure tells a client (the JSON-RPC error and REST status
  of each).

The error codes of the broker's HTTP API and MCP tools.

One :class:`ApiError` carries a stable ``code`` and a message. REST answers it as an
RFC 9457 problem (``application/problem+json`` with the HTTP status of its code and
a ``code`` member); an MCP tool answers it as a result marked ``isError`` whose text
is ``"<code>: <message>"``.
"""

from __future__ import annotations

from enum import StrEnum
from http import HTTPStatus


class ErrorCode(StrEnum):
    """What went wrong, as clients and models match on it."""

    UNAUTHORIZED = "unauthorized"  # no or bad credentials
    FORBIDDEN = "forbidden"  # good credentials, not enough scope
    INVALID_ARGUMENT = "invalid_argument"  # an input is missing, malformed or out of range
    INVALID_CURSOR = "invalid_cursor"  # a forged, truncated, foreign or mismatched cursor
    CURSOR_GAP = "cursor_gap"  # a stream's events after this cursor are no longer kept
    SESSION_NOT_RUNNING = "session_not_running"  # a session tool needs a RUNNING session
    SESSION_NOT_FOUND = "session_not_found"  # no such session (or another tenant's)
    SESSION_BUSY = "session_busy"  # a turn is already running in the session
    NOT_FOUND = "not_found"  # no such endpoint or session
    METHOD_NOT_ALLOWED = "method_not_allowed"
    UNAVAILABLE = "unavailable"  # the store cannot be reached; retry later
    OPERATION_CONFLICT = "operation_conflict"  # an Idempotency-Key reused with another request
    OPERATION_OUTCOME_UNKNOWN = "operation_outcome_unknown"  # its first request left no outcome
    REVISION_CONFLICT = "revision_conflict"  # a stale revision or claim (an interaction)
    LAST_OWNER = "last_owner"  # a revoke that would leave a session without an owner
    INTERNAL = "internal"


HTTP_STATUS: dict[ErrorCode, HTTPStatus] = {
    ErrorCode.UNAUTHORIZED: HTTPStatus.UNAUTHORIZED,
    ErrorCode.FORBIDDEN: HTTPStatus.FORBIDDEN,
    ErrorCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
    ErrorCode.INVALID_CURSOR: HTTPStatus.BAD_REQUEST,
    ErrorCode.CURSOR_GAP: HTTPStatus.CONFLICT,
    ErrorCode.SESSION_NOT_RUNNING: HTTPStatus.CONFLICT,
    ErrorCode.SESSION_NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.SESSION_BUSY: HTTPStatus.CONFLICT,
    ErrorCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorCode.METHOD_NOT_ALLOWED: HTTPStatus.METHOD_NOT_ALLOWED,
    ErrorCode.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    ErrorCode.OPERATION_CONFLICT: HTTPStatus.CONFLICT,
    ErrorCode.OPERATION_OUTCOME_UNKNOWN: HTTPStatus.CONFLICT,
    ErrorCode.REVISION_CONFLICT: HTTPStatus.CONFLICT,
    ErrorCode.LAST_OWNER: HTTPStatus.CONFLICT,
    ErrorCode.INTERNAL: HTTPStatus.INTERNAL_SERVER_ERROR,
}


class ApiError(Exception):
    """A failure to report to an API or tool caller."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def status(self) -> HTTPStatus:
        """The HTTP status REST answers this error with."""
        return HTTP_STATUS[self.code]


def invalid_argument(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_ARGUMENT, message)
