"""What a caller hears when a session's roles refuse an operation or an ACL change.

The conditions are the ACP Remote drafts' (provisional names), in ``data.condition`` with
``data.retryable``: ``forbidden`` (the principal's effective roles on the session lack the
permission, named in ``data.requiredPermission``: ``-32600``; REST 403; an MCP error result
``forbidden: …``) and ``last_owner`` (a revoke that would leave the session without an
owner: ``-32600``; REST 409). An ACL entry the session does not have is ``-32002``
(REST 404).
"""

from __future__ import annotations

from typing import Final

from ..protocol.jsonrpc import INVALID_REQUEST, RESOURCE_NOT_FOUND, RpcError
from . import ApiError, ErrorCode

FORBIDDEN: Final = "forbidden"
LAST_OWNER: Final = "last_owner"
ENTRY_NOT_FOUND: Final = "access_entry_not_found"


def forbidden(permission: str, operation: str) -> RpcError:
    """``operation`` needs ``permission`` on the session, which the caller's roles lack."""
    return RpcError(
        INVALID_REQUEST,
        f"forbidden: {operation} needs the {permission} permission on this session, which "
        "the caller's roles do not give",
        {"condition": FORBIDDEN, "retryable": False, "requiredPermission": permission},
    )


def revoked_while(permission: str, operation: str) -> RpcError:
    """A revoke took ``permission`` from the caller while ``operation`` followed the session:
    what came after it is not the caller's to see."""
    return RpcError(
        INVALID_REQUEST,
        f"forbidden: a revoke took the {permission} permission on this session while "
        f"{operation} followed it",
        {"condition": FORBIDDEN, "retryable": False, "requiredPermission": permission},
    )


def last_owner(entry_id: str) -> RpcError:
    return RpcError(
        INVALID_REQUEST,
        f"revoking {entry_id} would leave the session without an owner: grant another first",
        {"condition": LAST_OWNER, "retryable": False},
    )


def unknown_entry(entry_id: str) -> RpcError:
    return RpcError(
        RESOURCE_NOT_FOUND,
        f"the session has no access entry {entry_id}",
        {"condition": ENTRY_NOT_FOUND, "entryId": entry_id},
    )


_API_CODES = {
    FORBIDDEN: ErrorCode.FORBIDDEN,
    LAST_OWNER: ErrorCode.LAST_OWNER,
    ENTRY_NOT_FOUND: ErrorCode.NOT_FOUND,
}


def access_api_error(exc: RpcError) -> ApiError | None:
    """REST's and the tools' error for a refusal of this module (None: not one)."""
    condition = exc.data.get("condition") if isinstance(exc.data, dict) else None
    code = _API_CODES.get(condition) if isinstance(condition, str) else None
    return None if code is None else ApiError(code, exc.message)
