"""The conditions of ACP Remote's reliable transport (its draft's common provisional error
registry, by their provisional names), as a JSON-RPC error tells them.

The draft leaves numeric codes to a later registry: each is sent with code -32600
(Invalid Request) and the condition in ``data.condition``, with ``data.retryable`` and what
the client needs to recover (``oldest`` for ``cursor_gap``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

INVALID_REQUEST = -32600


class RemoteCondition(StrEnum):
    """The registry's conditions the broker reports."""

    UNAUTHENTICATED = "unauthenticated"  # no credentials on the WebSocket upgrade
    UNSUPPORTED_PROFILE = "unsupported_profile"  # no or another remote profile asked for
    INVALID_RESUME = "invalid_resume"  # no such connection for this tenant, or a bad secret
    CONNECTION_FENCED = "connection_fenced"  # a newer generation took the connection
    CURSOR_GAP = "cursor_gap"  # what followed the cursor is no longer kept


RETRYABLE = frozenset({RemoteCondition.CONNECTION_FENCED})
"""Conditions whose request may succeed as it is, later (none of the others can)."""


def remote_error(condition: RemoteCondition | None, message: str, **data: Any) -> dict[str, Any]:
    """The JSON-RPC ``error`` member for ``condition`` (None: a malformed remote frame,
    which the registry names no condition for)."""
    error: dict[str, Any] = {"code": INVALID_REQUEST, "message": message}
    if condition is not None:
        error["data"] = {"condition": condition.value, "retryable": condition in RETRYABLE, **data}
    return error
