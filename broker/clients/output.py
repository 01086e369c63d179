"""What the stdio bridge writes: editor-bound lines on stdout, one-line reports on stderr."""

from __future__ import annotations

import json
import sys
from typing import Final

__all__ = ["frame_to_line", "one_line", "report"]

PREFIX: Final = "acp-broker connect"


def frame_to_line(message: str | bytes) -> bytes | None:
    """Return the stdout line for a received frame, or ``None`` to skip the frame."""
    if isinstance(message, bytes) or not message or message.isspace():
        return None
    if "\n" in message or "\r" in message:
        try:
            message = json.dumps(json.loads(message), separators=(",", ":"))
        except ValueError as exc:
            report(f"dropped a multi-line frame that is not valid JSON ({exc})")
            return None
    return message.encode() + b"\n"


def report(message: str) -> None:
    """Write one ``acp-broker connect: ...`` line to stderr, ignoring a closed stderr."""
    try:
        sys.stderr.write(f"{PREFIX}: {one_line(message)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def one_line(text: str) -> str:
    """Collapse all whitespace runs, including line breaks, into single spaces."""
    return " ".join(text.split())
