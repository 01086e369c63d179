"""The Remote Frames of ACP Remote's reliable transport on WebSocket, by the draft's
provisional names (pure: no I/O).

A client asks for the binding with the WebSocket subprotocol :data:`SUBPROTOCOL` and an
``initialize`` whose ``params.remote`` names the profile :data:`PROFILE` (with
``capabilities.remote.core``), ``connection`` being ``{"type": "new"}`` or ``{"type":
"resume", "connectionId", "resumeSecret", "afterCursor"}``. After the raw ``initialize``
response, the broker sends only ``delivery`` records (each message at its cursor in the
connection's one stream) and takes ``submission``, ``submission_batch`` and ``ack`` frames.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...errors.remote import RemoteCondition, remote_error
from ...protocol.operations import MUTATIONS, OPERATION_ID

PROFILE = "acp.remote.v2"
SUBPROTOCOL = "acp.remote.v2"
SERVER_EPOCH = "1"
"""The delivery epoch: the streams live in the store, so a front's restart keeps their order."""
PAYLOAD_TYPES = frozenset({"jsonrpc", "reverse_response"})


class FrameError(ValueError):
    """A frame refused: ``condition`` from the registry, None for a malformed frame."""

    def __init__(self, condition: RemoteCondition | None, message: str, **data: Any) -> None:
        super().__init__(message)
        self.condition = condition
        self.data = data

    def error(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` member that tells it."""
        return remote_error(self.condition, str(self), **self.data)


@dataclass(frozen=True)
class Opening:
    """What an ``initialize`` asking for the reliable transport asked: a new connection
    (``resume`` None) or to resume one (``connectionId``, ``resumeSecret``,
    ``afterCursor``)."""

    msg_id: Any
    resume: dict[str, str] | None


@dataclass(frozen=True)
class ClientFrame:
    """A client's frame: the generation it claims, the acknowledged cursor it carries (an
    ``ack``'s, or a submission's ``ackCursor``), and the JSON-RPC messages it submits."""

    generation: str
    ack: str | None
    messages: list[str]


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise FrameError(None, f"{name} must be a non-empty string")
    return value


def opening(message: Any) -> Opening:
    """The ``initialize`` request that opens a reliable WebSocket, read; raises
    :class:`FrameError` when it is not one."""
    if not isinstance(message, dict) or message.get("method") != "initialize":
        raise FrameError(None, "the first message is the initialize request")
    if "id" not in message:
        raise FrameError(None, "initialize is a request: it needs an id")
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    remote = params.get("remote")
    if not isinstance(remote, dict) or remote.get("profile") != PROFILE:
        raise FrameError(
            RemoteCondition.UNSUPPORTED_PROFILE, f"params.remote.profile must be {PROFILE}"
        )
    version = params.get("protocolVersion")
    capabilities = params.get("capabilities")
    wanted = capabilities.get("remote") if isinstance(capabilities, dict) else None
    if not isinstance(version, int) or version < 2 or not isinstance(wanted, dict):
        raise FrameError(
            RemoteCondition.UNSUPPORTED_PROFILE,
            f"{PROFILE} is for protocolVersion 2 clients with capabilities.remote.core",
        )
    if not isinstance(wanted.get("core"), dict):
        raise FrameError(RemoteCondition.UNSUPPORTED_PROFILE, "capabilities.remote.core is needed")
    connection = remote.get("connection")
    kind = connection.get("type") if isinstance(connection, dict) else None
    if kind == "new":
        return Opening(message["id"], None)
    if kind != "resume":
        raise FrameError(None, 'params.remote.connection.type must be "new" or "resume"')
    assert isinstance(connection, dict)
    names = ("connectionId", "resumeSecret", "afterCursor")
    resume = {name: _text(connection.get(name), "connection." + name) for name in names}
    return Opening(message["id"], resume)


def client_frame(text: str, conn_id: str) -> ClientFrame:
    """A client's frame on connection ``conn_id``, read; raises :class:`FrameError` when it
    is malformed or names another connection."""
    try:
        frame = json.loads(text)
    except ValueError:
        raise FrameError(None, "a frame is one JSON object") from None
    if not isinstance(frame, dict):
        raise FrameError(None, "a frame is one JSON object")
    if frame.get("connectionId") != conn_id:
        raise FrameError(None, "connectionId is not this connection's")
    generation = frame.get("generation")
    if not isinstance(generation, str) or not generation.isdigit():
        raise FrameError(None, "generation must be a decimal string")
    kind = frame.get("type")
    if kind == "ack":
        return ClientFrame(generation, _text(frame.get("cursor"), "cursor"), [])
    items: Any
    if kind == "submission":
        items = [frame]
    elif kind == "submission_batch":
        items = frame.get("submissions")
        if not isinstance(items, list) or not items:
            raise FrameError(None, "submissions must be a non-empty array")
    else:
        raise FrameError(None, 'type must be "submission", "submission_batch" or "ack"')
    ack = frame.get("ackCursor")
    if "ackCursor" in frame:
        ack = _text(ack, "ackCursor")
    return ClientFrame(generation, ack, [_submitted(item) for item in items])


def _submitted(item: Any) -> str:
    """The JSON-RPC message (or batch) of one submission."""
    if not isinstance(item, dict):
        raise FrameError(None, "a submission is an object")
    operation = _text(item.get("operationId"), "operationId")
    payload = item.get("payload")
    if not isinstance(payload, dict) or payload.get("type") not in PAYLOAD_TYPES:
        raise FrameError(None, 'payload.type must be "jsonrpc" or "reverse_response"')
    message = payload.get("message")
    if not isinstance(message, dict | list):
        raise FrameError(None, "payload.message must be a JSON-RPC message")
    if isinstance(message, dict):
        _carry_operation(message, operation)
    return json.dumps(message, separators=(",", ":"))


def _carry_operation(message: dict[str, Any], operation: str) -> None:
    """Give a mutation the submission's ``operationId`` (as ``_meta.operationId``, where
    the operation ledger reads it) unless it carries one itself: a submission sent again
    with the same id is then run once, answered alike."""
    params = message.get("params")
    if message.get("method") not in MUTATIONS or not isinstance(params, dict):
        return
    meta = params.get("_meta")
    if OPERATION_ID in params or (isinstance(meta, dict) and OPERATION_ID in meta):
        return
    if meta is None:
        params["_meta"] = {OPERATION_ID: operation}
    elif isinstance(meta, dict):
        meta[OPERATION_ID] = operation


def delivery(conn_id: str, generation: int, cursor: int, text: str) -> str:
    """The ``delivery`` record of stored message ``text`` at ``cursor`` (its text is
    embedded as stored: JSON already)."""
    head = json.dumps(
        {
            "type": "delivery",
            "connectionId": conn_id,
            "generation": str(generation),
            "serverEpoch": SERVER_EPOCH,
            "sequence": str(cursor),
            "cursor": str(cursor),
        },
        separators=(",", ":"),
    )
    return f'{head[:-1]},"payload":{{"type":"jsonrpc","message":{text}}}}}'


def answered(response: str, remote: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The ``initialize`` response with the reliable transport's ``remote`` state and
    capability added to its result, and that result (None: the response is an error)."""
    message = json.loads(response)
    result = message.get("result")
    if not isinstance(result, dict):
        return response, None
    capabilities = result.setdefault("capabilities", {})
    if isinstance(capabilities, dict):
        capabilities["remote"] = {"core": {}}
    result["remote"] = remote
    return json.dumps(message, separators=(",", ":")), result


def error_message(msg_id: Any, error: dict[str, Any]) -> str:
    """A raw JSON-RPC error response (an ``initialize`` refused, or a frame)."""
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": error}, separators=(",", ":"))
