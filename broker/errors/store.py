"""What a store failure tells a client: the JSON-RPC error (and REST status) for each.

The store's own failures (Redis at ``maxmemory``, a session at its event bound, an
archive that cannot be read) are not bugs: each is answered with its own clear
message and a ``data.reason`` a client can match on, never "internal error".
"""

from __future__ import annotations

from http import HTTPStatus

from ..ops import metrics
from ..protocol.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, RpcError
from ..store.archive import ArchiveCorrupt
from ..store.faults import brief
from ..store.log import ArchiveUnavailable, SessionFull, StoreFull, is_oom
from ..store.query import BadCursor
from ..store.quotas import TenantFull
from ..store.retry import is_store_away
from . import ApiError, ErrorCode

STORE_FULL_MESSAGE = (
    "the session store is full (Redis reached maxmemory): nothing was written; "
    "reads keep working, writes resume once space is freed"
)


def store_unreachable(exc: BaseException) -> RpcError:
    """The error a client sees when the session store failed its request (it is out of
    reach: :data:`~broker.store.retry.STORE_AWAY`), on a front or on the agent host that ran it."""
    return RpcError(
        INTERNAL_ERROR,
        f"the session store is unreachable ({brief(exc)}): it is restarting, failing over "
        "or stalled; try again shortly",
        {"reason": "store_unavailable"},
    )


def session_lost(session_id: str) -> RpcError:
    """The error for a session the store lost just after an agent host made it (a failover
    that took the new master before replication kept the session): try again, as for a
    store out of reach."""
    return RpcError(
        INTERNAL_ERROR,
        f"the session store lost the new session {session_id} (it failed over before the "
        "session was replicated); try again shortly",
        {"reason": "store_unavailable"},
    )


def store_full(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a write at ``maxmemory``."""
    return isinstance(exc, StoreFull) or is_oom(exc)


def rpc_failure(exc: BaseException) -> RpcError | None:
    """The JSON-RPC error for a store failure (one out of reach included:
    :func:`~broker.store.retry.is_store_away`); None for anything else."""
    failure = _rpc_failure(exc)
    if failure is not None and isinstance(failure.data, dict):
        reason = str(failure.data.get("reason"))
        if reason not in ("archive_unreadable", "store_unavailable"):  # not refused: unread
            metrics.WRITES_REFUSED.labels(reason).inc()
    return failure


def _rpc_failure(exc: BaseException) -> RpcError | None:
    if is_store_away(exc):  # a restart, a stall or a failover: "try again", never "internal"
        return store_unreachable(exc)
    if store_full(exc):
        return RpcError(INTERNAL_ERROR, STORE_FULL_MESSAGE, {"reason": "store_full"})
    if isinstance(exc, SessionFull):
        return RpcError(
            INVALID_REQUEST,
            f"the session is full: {_detail(exc)}; start a new session",
            {"reason": "session_full"},
        )
    if isinstance(exc, TenantFull):
        return RpcError(INVALID_REQUEST, str(exc), {"reason": "tenant_full"})
    if isinstance(exc, ArchiveCorrupt | ArchiveUnavailable):
        return RpcError(
            INTERNAL_ERROR,
            f"the session's archived log cannot be read: {exc}",
            {"reason": "archive_unreadable"},
        )
    return None


def http_failure(exc: BaseException) -> tuple[HTTPStatus, str] | None:
    """The HTTP status and message for a store failure; None for anything else."""
    if store_full(exc):
        return HTTPStatus.SERVICE_UNAVAILABLE, STORE_FULL_MESSAGE
    if is_store_away(exc):
        return HTTPStatus.SERVICE_UNAVAILABLE, store_unreachable(exc).message
    failure = rpc_failure(exc)
    if failure is not None:
        return HTTPStatus.INTERNAL_SERVER_ERROR, failure.message
    return None


def _detail(exc: BaseException) -> str:
    text = str(exc)
    return text.split(" ", 1)[1] if text.startswith("LIMIT ") else text


def query_refused(exc: BadCursor) -> ApiError:
    """The API error for a session list query whose cursor the store refused."""
    return ApiError(ErrorCode.INVALID_CURSOR, str(exc))
