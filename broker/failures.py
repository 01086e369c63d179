"""Moved to :mod:`broker.errors.failures` (kept while branches that import it merge)."""

from .errors.failures import SUMMARY_INTERVAL, FailureLog, describe

__all__ = ["SUMMARY_INTERVAL", "FailureLog", "describe"]
