"""What a client hears when an operation id cannot simply be run or answered.

The conditions are the ACP Remote drafts' common registry (provisional names): each JSON-RPC
error carries ``data.condition`` and ``data.retryable`` as the drafts say; REST answers the
same condition as its problem ``code`` (``operation_conflict``, ``operation_outcome_unknown``:
409; a first request still running: ``unavailable``, 503), an MCP tool as its error
result's code.
"""

from __future__ import annotations

from typing import Final

from ..protocol.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, RpcError
from . import ApiError, ErrorCode

OPERATION_CONFLICT: Final = "operation_conflict"
OPERATION_OUTCOME_UNKNOWN: Final = "operation_outcome_unknown"
TEMPORARILY_UNAVAILABLE: Final = "temporarily_unavailable"

CONFLICT_MESSAGE: Final = (
    "this operationId was used with another request (method or params): "
    "use a new operationId for a new operation"
)
UNKNOWN_MESSAGE: Final = (
    "the first request with this operationId ended without an outcome the broker can prove "
    "(its connection or node went away mid-way): check the session's state, and send the "
    "operation again under a new operationId only if it did not happen"
)
_ID: Final = "operationId"
_KEY: Final = "Idempotency-Key"
PENDING_MESSAGE: Final = (
    "the first request with this operationId is still running: retry it (same operationId) shortly"
)


def rest_conflict(name: str = _KEY) -> ApiError:
    """REST's (and the MCP tools') :func:`operation_conflict`: an ``Idempotency-Key`` (or
    the ``name`` the surface gives its id) with another request."""
    return ApiError(ErrorCode.OPERATION_CONFLICT, CONFLICT_MESSAGE.replace(_ID, name))


def rest_outcome_unknown(name: str = _KEY) -> ApiError:
    """REST's (and the MCP tools') :func:`operation_outcome_unknown`."""
    return ApiError(ErrorCode.OPERATION_OUTCOME_UNKNOWN, UNKNOWN_MESSAGE.replace(_ID, name))


def rest_pending(name: str = _KEY) -> ApiError:
    """REST's (and the MCP tools') :func:`operation_pending`."""
    return ApiError(ErrorCode.UNAVAILABLE, PENDING_MESSAGE.replace(_ID, name))


def operation_conflict() -> RpcError:
    """The id was claimed with another input: a client bug, not to retry unchanged."""
    return RpcError(
        INVALID_REQUEST, CONFLICT_MESSAGE, {"condition": OPERATION_CONFLICT, "retryable": False}
    )


def operation_outcome_unknown() -> RpcError:
    """The first request died without an outcome, and running the operation again could
    apply it twice."""
    return RpcError(
        INTERNAL_ERROR,
        UNKNOWN_MESSAGE,
        {"condition": OPERATION_OUTCOME_UNKNOWN, "retryable": False},
    )


def operation_pending() -> RpcError:
    """The first request still runs past this retry's wait."""
    return RpcError(
        INTERNAL_ERROR,
        PENDING_MESSAGE,
        {"condition": TEMPORARILY_UNAVAILABLE, "retryable": True},
    )
