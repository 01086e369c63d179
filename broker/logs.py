"""Logging hygiene: credentials never reach a log, whatever the level.

:class:`RedactCredentials` masks, in every record it sees: the credential headers that
``websockets`` logs at DEBUG level; the query string of a logged request line (a client
may put a token there); the payload of every WebSocket frame ``websockets`` dumps at
DEBUG (an in-band ``authenticate`` carries a token, and a long frame's dump shows its
tail, so a pattern could not find what is left of it); and anything shaped like an API
token or a JWT. :func:`install_redaction` puts it on the loggers that see raw traffic and
on the root logger's handlers, which every record that propagates reaches.
"""

from __future__ import annotations

import logging
import re

_SECRET_HEADER = re.compile(
    r"^([<>] (?:authorization|cookie|sec-websocket-protocol|set-cookie): ).*$",
    re.IGNORECASE,
)
_REQUEST_QUERY = re.compile(r"^([<>] [A-Z]+ [^?\s]*)\?\S*")
_FRAME_DUMP = re.compile(r"^([<>] (?:TEXT|BINARY|CONT)) .*?(\[\d+ bytes(?:, continued)?\])?$")
_API_TOKEN = re.compile(r"acpb_([0-9A-Za-z]+)_[0-9A-Za-z_-]+")
_JWT = re.compile(r"eyJ[0-9A-Za-z_-]*\.[0-9A-Za-z_-]+\.[0-9A-Za-z_-]*")


def redact(message: str) -> str:
    """``message`` with every credential it may hold masked."""
    masked = _SECRET_HEADER.sub(r"\1[redacted]", message)
    masked = _REQUEST_QUERY.sub(r"\1?[redacted]", masked)
    masked = _FRAME_DUMP.sub(lambda m: f"{m[1]} [redacted] {m[2] or ''}".rstrip(), masked)
    masked = _API_TOKEN.sub(r"acpb_\1_[redacted]", masked)
    return _JWT.sub("[redacted JWT]", masked)


class RedactCredentials(logging.Filter):
    """Masks credentials in a record's message (see the module's docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            # A traceback may quote a frame or a header: format it now, masked.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_RAW_TRAFFIC = ("websockets.server", "websockets.client", "uvicorn.error", "uvicorn.access")


def install_redaction() -> None:
    """Attach the filter to the loggers that see raw traffic and to the root logger's
    handlers (idempotent)."""
    targets: list[logging.Filterer] = [logging.getLogger(name) for name in _RAW_TRAFFIC]
    targets += logging.getLogger().handlers
    for target in targets:
        if not any(isinstance(f, RedactCredentials) for f in target.filters):
            target.addFilter(RedactCredentials())
