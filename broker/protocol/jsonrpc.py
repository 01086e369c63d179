"""JSON-RPC 2.0 framing: parsing frames, building replies, the error codes ACP uses.

Pure functions over text and dicts; no I/O. A frame that is not a valid
message yields the error reply to send (with ``id: null`` when the id is not
known), never an exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import fastjson

JsonObject = dict[str, Any]
RequestId = int | str

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800
LIMIT_EXCEEDED = -32005
"""JSON-RPC server error: a rate or size limit of the broker was hit (``data.limit`` says which)."""


class RpcError(Exception):
    """An error to answer a request with."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> JsonObject:
        error: JsonObject = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def invalid_params(message: str, data: Any = None) -> RpcError:
    return RpcError(INVALID_PARAMS, message, data)


def not_found(what: str) -> RpcError:
    return RpcError(RESOURCE_NOT_FOUND, f"{what} not found")


def session_not_found(session_id: str, what: str = "session") -> RpcError:
    """-32002 for a session that does not exist (or is not active where it must be), with the
    ``SessionNotFoundErrorData`` ACP v2 defines (``{sessionId}``; harmless in v1)."""
    return RpcError(RESOURCE_NOT_FOUND, f"{what} not found", {"sessionId": session_id})


def log_lost(session_id: str) -> RpcError:
    """-32002 for a session whose log the store no longer holds at all, though its snapshot
    says it had events (a Redis let evict keys, ``--allow-evicting-store``): there is no
    history to replay, nor any to trust."""
    return RpcError(
        RESOURCE_NOT_FOUND,
        "this session's log was lost (the store dropped it)",
        {"sessionId": session_id},
    )


@dataclass(frozen=True, slots=True)
class Request:
    """A request (``id`` set) or a notification (``id`` None)."""

    method: str
    params: JsonObject
    id: RequestId | None = None

    @property
    def is_notification(self) -> bool:
        return self.id is None


@dataclass(frozen=True, slots=True)
class Response:
    """A reply to a request this side sent: ``result`` or ``error``."""

    id: RequestId
    result: Any = None
    error: JsonObject | None = None


Message = Request | Response


@dataclass(frozen=True, slots=True)
class Invalid:
    """A frame that is not a message, and the error reply it earns (None: stay silent)."""

    reply: JsonObject | None


@dataclass(frozen=True, slots=True)
class Batch:
    """A JSON-RPC batch: its entries in order, each a message or what to answer instead."""

    entries: tuple[Message | Invalid, ...]


def parse_frame(
    text: str | bytes, *, max_depth: int = 64, strict_numbers: bool = False
) -> Message | Invalid:
    """Parse one text frame into a message, or say what to answer instead.

    ``strict_numbers`` (a client's frames): a number that is not finite as a double or
    an integer outside 64 bits earns -32602, since it could not be written back as
    strict JSON (``1e999`` reads as infinity) or read back exactly by every peer.
    """
    decoded = _decode(text, max_depth, strict_numbers)
    return decoded if type(decoded) is Invalid else parse_message(decoded)


def parse_frame_or_batch(
    text: str | bytes, *, max_depth: int = 64, max_entries: int = 100, strict_numbers: bool = False
) -> Message | Invalid | Batch:
    """:func:`parse_frame` for a peer that may also send batches (ACP v2) of at most
    ``max_entries`` entries (a longer one earns one Invalid Request: nothing of it runs)."""
    decoded = _decode(text, max_depth, strict_numbers)
    if type(decoded) is Invalid:
        return decoded
    if type(decoded) is list:
        if len(decoded) > max_entries:
            too_long = RpcError(
                INVALID_REQUEST,
                f"Invalid Request: a batch holds at most {max_entries} entries",
                {"limit": "max_batch_entries"},
            )
            return Invalid(error_reply(None, too_long))
        return parse_batch(decoded)
    return parse_message(decoded)


def _decode(text: str | bytes, max_depth: int, strict_numbers: bool = False) -> Any:
    """The JSON value ``text`` holds, or the :class:`Invalid` to answer instead (no JSON
    value is one)."""
    # The text's UTF-8 and its shapes (:data:`_NUMBER_SHAPES`) are made once, for every
    # look below: each made its own before (a third of a small request's parsing).
    try:
        raw = text.encode() if isinstance(text, str) else text
        shapes = raw.translate(_NUMBER_SHAPES)
        # orjson's reading where it is the standard library's (a tenth of its time), the
        # standard library's (refusing NaN and Infinity) for every text orjson refuses.
        data = fastjson.loads_translated(raw, shapes, _strict_loads)
        # Lone surrogates are not Unicode, written as they are (a str from anywhere but a
        # WebSocket) or as valid JSON escapes: nothing holding one could be stored or sent
        # on, so such a frame is refused here, at the edge.
        if raw.find(b"\\u") >= 0:
            encode(data).encode()
    except (ValueError, RecursionError):
        return Invalid(error_reply(None, RpcError(PARSE_ERROR, "Parse error: not valid JSON")))
    # No value nests deeper than the text has ``[`` and ``{``: most frames need no walk.
    if raw.count(b"[") + raw.count(b"{") > max_depth and _depth_exceeds(data, max_depth):
        return Invalid(error_reply(None, RpcError(INVALID_REQUEST, "message nested too deeply")))
    if strict_numbers and _may_hold_bad_number(shapes) and _bad_number(data):
        return _number_refused(data)
    return data


# Digits to "0", "e", "E" and "+" to "e", the rest to spaces: then a long run of digits or a
# big exponent ("e000", "ee000" for "e+000") is one ``find`` (a regex with this alternation
# costs more than the parse; a "+" elsewhere only makes a rare walk).
_NUMBER_SHAPES = bytes(
    0x30 if 0x30 <= i <= 0x39 else 0x65 if i in (0x45, 0x65, 0x2B) else 0x20 for i in range(256)
)


def _may_hold_bad_number(shapes: bytes) -> bool:
    """Whether the text whose :data:`_NUMBER_SHAPES` are ``shapes`` may hold a number
    :func:`_bad_number` refuses: 20 digits in a row (an integer past 64 bits, or a mantissa
    that long) or a 3-digit exponent (``1e999``). Only such text, rare, is walked."""
    return shapes.find(b"e000") >= 0 or shapes.find(b"00000000000000000000") >= 0


INVALID_ID = "id must be a string or an integer"
"""The message of the -32600 that answers an id JSON-RPC does not allow."""
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""The integers every peer reads exactly (int64 and uint64)."""


def _bad_number(value: Any) -> bool:
    """Whether a decoded value holds a non-finite float or an integer outside 64 bits."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, int) and not INT_MIN <= item <= INT_MAX:
            return True
    return False


def _number_refused(data: Any) -> Invalid:
    """-32602 for a message holding a number that cannot be kept exactly (a notification:
    silence; a batch: one reply with ``id: null``)."""
    error = invalid_params(
        "numbers must be finite and integers within 64 bits (this one cannot be kept exactly)"
    )
    if isinstance(data, dict):
        if "id" not in data and "method" in data:
            return Invalid(None)
        msg_id = data.get("id")
        if "id" in data and _bad_number(msg_id):  # the id itself: not one JSON-RPC allows
            return _invalid_id(data)
        return Invalid(error_reply(msg_id if _valid_id(msg_id) else None, error))
    return Invalid(error_reply(None, error))


def _invalid_id(data: JsonObject) -> Invalid:
    """A message whose id is a number no peer could echo exactly (``1e999``, an integer past
    64 bits): -32600 with ``id: null``, as any id that is not a string or an integer, or,
    a reply, nothing (a reply is never answered)."""
    if "method" not in data and ("result" in data or "error" in data):
        return Invalid(None)
    return Invalid(error_reply(None, RpcError(INVALID_REQUEST, INVALID_ID)))


def parse_batch(items: list[Any]) -> Batch | Invalid:
    """A batch array as JSON-RPC 2.0 (and ACP v2's transports page) has it.

    An empty array earns one Invalid Request (not an array); each invalid entry
    of a non-empty one earns its own Invalid Request with ``id: null``.
    """
    if not items:
        return Invalid(error_reply(None, RpcError(INVALID_REQUEST, "Invalid Request: empty batch")))
    return Batch(tuple(_batch_entry(item) for item in items))


def _batch_entry(item: Any) -> Message | Invalid:
    message = parse_message(item)
    reply = message.reply if isinstance(message, Invalid) else None
    if reply is not None and reply["error"]["code"] == INVALID_REQUEST:
        return Invalid({**reply, "id": None})
    return message


def parse_message(data: Any) -> Message | Invalid:
    """Classify one decoded JSON value as a request, notification or response."""
    # Most messages are well-formed requests: told apart from the rest in a few looks (the
    # full classification below gives every one of them the same Request).
    method = data.get("method") if type(data) is dict else None
    if type(method) is str and method and data.get("jsonrpc") == "2.0":
        msg_id = data.get("id", _ABSENT)
        params = data.get("params", _ABSENT)
        if (type(msg_id) is int or type(msg_id) is str) and type(params) is dict:
            return Request(method, params, msg_id)
    return _classify(data)


_ABSENT = object()


def _classify(data: Any) -> Message | Invalid:
    """:func:`parse_message` of any value: every rule of JSON-RPC 2.0 applied in turn."""
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
        return Invalid(_invalid_request(data))
    msg_id = data.get("id")
    if "method" not in data and ("result" in data or "error" in data):
        return _parse_response(data, msg_id)
    if "id" in data and not _valid_id(msg_id):
        return Invalid(error_reply(None, RpcError(INVALID_REQUEST, INVALID_ID)))
    if "id" in data and msg_id is None and "method" in data:
        # Not a notification (that has no id at all): it is answered, and refused, since a
        # reply with id null could not be told from one to an unreadable message (ACP v2
        # forbids a null id; JSON-RPC 2.0 and ACP v1 discourage it).
        return Invalid(error_reply(None, RpcError(INVALID_REQUEST, "id must not be null")))
    if "method" in data:
        return _parse_request(data, msg_id)
    return Invalid(_invalid_request(data))


def _parse_response(data: JsonObject, msg_id: Any) -> Message | Invalid:
    """A reply: never answered, even when malformed (that would start an error ping-pong)."""
    if not _valid_id(msg_id) or msg_id is None:
        return Invalid(None)
    if "error" in data:
        error = data["error"]
        if not isinstance(error, dict) or not _is_int(error.get("code")):
            error = {"code": INTERNAL_ERROR, "message": "malformed error reply", "data": error}
        return Response(msg_id, None, error)
    return Response(msg_id, data.get("result"), None)


def _parse_request(data: JsonObject, msg_id: Any) -> Message | Invalid:
    method = data["method"]
    if not isinstance(method, str) or not method:
        return Invalid(_invalid_request(data))
    params = data.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        reply = error_reply(msg_id, invalid_params("params must be an object"))
        return Invalid(reply if msg_id is not None else None)
    return Request(method, params, msg_id)


def _invalid_request(data: Any) -> JsonObject:
    msg_id = data.get("id") if isinstance(data, dict) and _valid_id(data.get("id")) else None
    return error_reply(
        msg_id, RpcError(INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message")
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
"""``json.loads`` with these options would build a decoder a call (a tenth of a no-op
request's parsing)."""


def _strict_loads(text: str | bytes) -> Any:
    """The standard library's reading, NaN and Infinity refused (UTF-8 that is not valid
    raises ``UnicodeDecodeError``, a ``ValueError``)."""
    return _DECODER.decode(text.decode() if isinstance(text, bytes) else text)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_id(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, str)
        or (isinstance(value, int) and not isinstance(value, bool))
    )


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        items: Iterable[Any]
        if isinstance(item, dict):
            items = item.values()
        elif isinstance(item, list):
            items = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in items)
    return False


def result_reply(msg_id: RequestId, result: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def error_reply(msg_id: RequestId | None, error: RpcError) -> JsonObject:
    return {"jsonrpc": "2.0", "id": msg_id, "error": error.to_json()}


def request(msg_id: RequestId, method: str, params: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def notification(method: str, params: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def encode(message: JsonObject) -> str:
    """One message as compact JSON text: one frame, or one line of stdio."""
    return fastjson.dumps(message)


def encode_result(msg_id: RequestId, result: str) -> str:
    """:func:`encode` of a :func:`result_reply` whose result is JSON text already (a
    :class:`~..fastjson.Fragment`'s): spliced, not passed through the encoder, which copies
    a fragment three times over (a list page is 15 KB)."""
    return '{"jsonrpc":"2.0","id":' + fastjson.dumps(msg_id) + ',"result":' + result + "}"


def encode_result_parts(msg_id: RequestId, result: bytes) -> tuple[bytes, bytes, bytes]:
    """:func:`encode_result` for a result that is UTF-8 JSON text already: the reply's
    bytes in three parts (around ``result`` as it is), for the caller to join once, with
    whatever goes before them (a frame's header)."""
    return b'{"jsonrpc":"2.0","id":' + fastjson.dumps(msg_id).encode() + b',"result":', result, b"}"


def encode_batch(messages: list[JsonObject]) -> str:
    """A batch reply (never empty) as one frame."""
    return fastjson.dumps(messages)


def pack_batches(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    """Encoded messages (each one JSON object's text) as frames of JSON-RPC batch arrays, in
    order, each at most ``max_chars`` long where its messages allow; each frame as soon as
    it is full (a sender may send it while the next is being made).

    A batch of notifications is a valid JSON-RPC 2.0 (and ACP v2) message, answered by
    nothing. A message that would make a batch of one is sent bare, and one longer than
    ``max_chars`` goes alone: a receiver gets every message once, in the order given.
    """
    group: list[str] = []
    size = 1  # the closing bracket; each message adds its length and a "[" or ","
    for text in texts:
        if group and size + len(text) + 1 > max_chars:
            yield _batch_text(group)
            group, size = [], 1
        group.append(text)
        size += len(text) + 1
    if group:
        yield _batch_text(group)


def _batch_text(group: list[str]) -> str:
    return group[0] if len(group) == 1 else "[" + ",".join(group) + "]"
