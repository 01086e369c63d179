"""Logging: credentials never reach a log, whatever the level; text or JSON lines.

:class:`RedactCredentials` masks, in every record it sees: the credential headers that
``websockets`` logs at DEBUG level; the query string of a logged request line (a client
may put a token there); the payload of every WebSocket frame ``websockets`` dumps at
DEBUG (an in-band ``authenticate`` carries a token, and a long frame's dump shows its
tail, so a pattern could not find what is left of it); anything shaped like an API
token or a JWT; and the secrets of a store URL (its password, ``?password=`` …).
:func:`install_redaction` puts it on the loggers that see raw traffic and on the root
logger's handlers, which every record that propagates reaches.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime

from .store.urls import masked_url

_SECRET_HEADER = re.compile(
    r"^([<>] (?:authorization|cookie|sec-websocket-protocol|set-cookie): ).*$",
    re.IGNORECASE,
)
_REQUEST_QUERY = re.compile(r"^([<>] [A-Z]+ [^?\s]*)\?\S*")
_FRAME_DUMP = re.compile(r"^([<>] (?:TEXT|BINARY|CONT)) .*?(\[\d+ bytes(?:, continued)?\])?$")
_API_TOKEN = re.compile(r"acpb_([0-9A-Za-z]+)_[0-9A-Za-z_-]+")
_JWT = re.compile(r"eyJ[0-9A-Za-z_-]*\.[0-9A-Za-z_-]+\.[0-9A-Za-z_-]*")
_STORE_URL = re.compile(r"\b(?:rediss?|unix)(?:\+(?:sentinel|cluster))?://[^\s'\"<>]+")


def redact(message: str) -> str:
    """``message`` with every credential it may hold masked."""
    masked = _SECRET_HEADER.sub(r"\1[redacted]", message)
    masked = _REQUEST_QUERY.sub(r"\1?[redacted]", masked)
    masked = _FRAME_DUMP.sub(lambda m: f"{m[1]} [redacted] {m[2] or ''}".rstrip(), masked)
    masked = _API_TOKEN.sub(r"acpb_\1_[redacted]", masked)
    masked = _STORE_URL.sub(lambda m: masked_url(m[0]), masked)
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


_PER_CONNECTION = ("websockets.server",)
"""Loggers that write a line per connection at INFO (kept for ``-v``)."""
_RAW_TRAFFIC = ("websockets.server", "websockets.client", "uvicorn.error", "uvicorn.access")


def install_redaction() -> None:
    """Attach the filter to the loggers that see raw traffic and to the root logger's
    handlers (idempotent)."""
    targets: list[logging.Filterer] = [logging.getLogger(name) for name in _RAW_TRAFFIC]
    targets += logging.getLogger().handlers
    for target in targets:
        if not any(isinstance(f, RedactCredentials) for f in target.filters):
            target.addFilter(RedactCredentials())


class JsonLines(logging.Formatter):
    """One JSON object a line (``--log-format json``), for log collectors: ``ts`` (ISO 8601,
    UTC), ``level``, ``logger``, ``message``, and ``error`` (the exception's class and
    message) when a record carries one; its traceback only at DEBUG level."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            entry["error"] = f"{type(exc).__name__}: {exc}"
            if logging.getLogger().isEnabledFor(logging.DEBUG):
                entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(*, verbose: bool, log_format: str) -> None:
    """Set up the root logger on stderr: ``text`` (the default) or ``json``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # websockets says "connection open" (and each refusal) at INFO: a line per connection,
    # 10,000 a burst when a node's clients reconnect here at once, and 4% of the front's
    # CPU under such a burst. They are kept for -v; failures (WARNING and up) always show.
    per_connection = logging.DEBUG if verbose else logging.WARNING
    for name in _PER_CONNECTION:
        logging.getLogger(name).setLevel(per_connection)


def start_line(role: str, store: str, roles: list[str], agents: list[str]) -> str:
    """What a process says first: what it is, which store (password masked), which roles
    run in it, which agents it may start."""
    return (
        f"acp-broker {role} starting: store {store}; roles: {', '.join(roles)}; "
        f"agents: {', '.join(agents) or 'none'}"
    )
