"""Moved to :mod:`broker.errors.store` (kept while branches that import it merge)."""

from ..errors.store import (
    STORE_FULL_MESSAGE,
    http_failure,
    rpc_failure,
    store_full,
    store_unreachable,
)

__all__ = ["STORE_FULL_MESSAGE", "http_failure", "rpc_failure", "store_full", "store_unreachable"]
