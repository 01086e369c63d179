"""JSON on the hot paths: log events in (pub/sub, XRANGE), frames out, bodies appended.

orjson does the work where it accepts the value; where it refuses (a lone surrogate, a
non-string key, anything else it does not take) the standard library does it, so every
input gets the outcome it had before, only faster. The output is the same compact JSON
(``separators=(",", ":")``, ``ensure_ascii=False``) but for how some floats are spelled
(``1e-7`` where the standard library writes ``1e-07``: the same number); NaN and Infinity,
which orjson would write as ``null``, cannot arise: :mod:`broker.protocol.jsonrpc` refuses
them on the way in. Client input is still parsed by :mod:`broker.protocol.jsonrpc`, with its
limits and checks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; this keeps a bare install alive
    orjson = None  # type: ignore[assignment]


# orjson reads an integer past 64 bits as a float, silently: text with a run of 19 digits
# (which may hold one) is left to the standard library, which reads it exactly. The run is
# looked for with a byte translation (0.2 us a message, a regex took 2.4).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_RUN = b"0" * 19


def loads(text: str | bytes, fallback: Callable[[str | bytes], Any] = json.loads) -> Any:
    """Parse JSON text (as ``json.loads``, or ``fallback``: what any text orjson refuses, or
    may read otherwise, is given to)."""
    if orjson is not None:
        try:
            data = text.encode() if isinstance(text, str) else text
        except UnicodeEncodeError:  # a lone surrogate: the standard library's
            return fallback(text)
        if data.translate(_DIGITS_AS_ZEROS).find(_LONG_RUN) < 0:
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
    return fallback(text)


def loads_translated(
    data: bytes, digits: bytes, fallback: Callable[[str | bytes], Any] = json.loads
) -> Any:
    """:func:`loads` of UTF-8 ``data``, for a caller that translated it already by a table
    that makes every ASCII digit ``0`` (``digits``: its translation; what the table makes of
    other bytes does not matter, but it must not make ``0`` of them)."""
    # find, not ``in``: on Python 3.11 ``in`` costs bytes twice as much.
    if orjson is not None and digits.find(_LONG_RUN) < 0:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return fallback(data)


def loads_shape(text: str) -> Any:
    """``text`` parsed for a look at its shape (which keys, which strings), not for its
    values: orjson's reading where it takes the text (an integer past 64 bits comes back as
    a float), None where it does not. For a hot path that sends the text on as it is once it
    knows the shape: :func:`loads` first looks through each text for such integers."""
    if orjson is None:
        try:
            return json.loads(text)
        except ValueError:
            return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


class Fragment:
    """JSON text (or its UTF-8 bytes) that :func:`dumps` puts into its output as it is,
    unparsed: the caller vouches for it (it was made by :func:`dumps`)."""

    __slots__ = ("text",)

    def __init__(self, text: str | bytes) -> None:
        self.text = text


def _orjson_default(value: Any) -> Any:
    if isinstance(value, Fragment):
        return orjson.Fragment(value.text)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _json_default(value: Any) -> Any:
    if isinstance(value, Fragment):  # the standard library can only parse and encode it again
        return json.loads(value.text)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> str:
    """Compact JSON text (as ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)``)."""
    if orjson is not None:
        try:
            return orjson.dumps(value, default=_orjson_default).decode()
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            pass
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_json_default)
