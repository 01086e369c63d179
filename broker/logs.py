"""Logging hygiene: credentials never reach a log, whatever the level."""

from __future__ import annotations

import logging
import re

_SECRET_HEADER = re.compile(
    r"^([<>] (?:authorization|cookie|sec-websocket-protocol|set-cookie): ).*$",
    re.IGNORECASE,
)


class RedactCredentials(logging.Filter):
    """Masks the credential headers that ``websockets`` logs at DEBUG level."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = _SECRET_HEADER.sub(r"\1[redacted]", message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def install_redaction() -> None:
    """Attach the filter to the loggers that see raw HTTP headers (idempotent)."""
    for name in ("websockets.server", "websockets.client", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactCredentials) for f in logger.filters):
            logger.addFilter(RedactCredentials())
