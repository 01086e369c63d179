"""What a caller hears when a pending interaction refuses a change.

The conditions are the ACP Remote drafts' (provisional names), in ``data.condition`` with
``data.retryable``: ``revision_conflict`` (a stale revision, a claim that is not current, an
interaction that already ended or that this session does not have: ``-32600``; REST 409) and
``forbidden`` (the credential may not answer: ``-32600``; REST 403). A malformed answer (an
option the agent did not offer, an unknown action) is ``-32602`` invalid params (REST 400).
"""

from __future__ import annotations

from typing import Final

from ..protocol.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, JsonObject, RpcError
from . import ApiError, ErrorCode

REVISION_CONFLICT: Final = "revision_conflict"
FORBIDDEN: Final = "forbidden"
INVALID: Final = "invalid"


def interaction_error(condition: str, message: str, current: JsonObject | None = None) -> RpcError:
    """The JSON-RPC error of a refused change; ``current``: the interaction as it is now
    (named in ``data`` with its revision, so the caller can read and try again)."""
    if condition == INVALID:
        return RpcError(INVALID_PARAMS, message)
    data: JsonObject = {"condition": condition, "retryable": False}
    if current is not None:
        data["conflictDomain"] = "interaction_revision"
        data["currentInteractionRevision"] = current.get("revision")
        data["interaction"] = current
    return RpcError(INVALID_REQUEST, message, data)


def unknown_interaction(interaction_id: str) -> RpcError:
    """An id this session has no pending interaction under (answered long ago, or never)."""
    return interaction_error(
        REVISION_CONFLICT, f"no pending interaction {interaction_id} in this session"
    )


def not_allowed() -> RpcError:
    """The caller's credential may not answer the session's interactions."""
    return RpcError(
        INVALID_REQUEST,
        "forbidden: this principal may not answer the session's interactions (it needs the "
        "session.approve permission: an approver or owner role)",
        {"condition": FORBIDDEN, "retryable": False, "requiredPermission": "session.approve"},
    )


def interaction_api_error(exc: RpcError) -> ApiError | None:
    """REST's and the tools' error for a refused interaction change (None: not one)."""
    condition = exc.data.get("condition") if isinstance(exc.data, dict) else None
    if condition == REVISION_CONFLICT:
        return ApiError(ErrorCode.REVISION_CONFLICT, exc.message)
    if condition == FORBIDDEN:
        return ApiError(ErrorCode.FORBIDDEN, exc.message)
    return None
