"""JSON-RPC 2.0 framing: parsing frames, building replies, the error codes ACP uses.

Pure functions over text and dicts; no I/O. A frame that is not a valid
message yields the error reply to send (with ``id: null`` when the id is not
known), never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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


def parse_frame(text: str | bytes, *, max_depth: int = 64) -> Message | Invalid:
    """Parse one text frame into a message, or say what to answer instead."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return Invalid(error_reply(None, RpcError(PARSE_ERROR, "Parse error: not valid JSON")))
    if _depth_exceeds(data, max_depth):
        return Invalid(error_reply(None, RpcError(INVALID_REQUEST, "message nested too deeply")))
    return parse_message(data)


def parse_message(data: Any) -> Message | Invalid:
    """Classify one decoded JSON value as a request, notification or response."""
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
        return Invalid(_invalid_request(data))
    msg_id = data.get("id")
    if "id" in data and not _valid_id(msg_id):
        return Invalid(
            error_reply(None, RpcError(INVALID_REQUEST, "id must be a string or an integer"))
        )
    if "method" in data:
        return _parse_request(data, msg_id)
    if "result" in data or "error" in data:
        if not _valid_id(msg_id) or msg_id is None:
            return Invalid(None)  # a reply we cannot correlate: nothing to answer
        error = data.get("error")
        return Response(msg_id, data.get("result"), error if isinstance(error, dict) else None)
    return Invalid(_invalid_request(data))


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
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)
