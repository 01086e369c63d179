"""The ACP v2 surface: version negotiation, ``initialize``, ``replayFrom``, replies, requests.

Pure functions. A connection speaks exactly one version after ``initialize``;
:func:`negotiate` picks it. Everything a v2 client is sent passes through here
or :mod:`.v2_render` (log events) on its way out, and what it sends that the v1
agents must see passes through :mod:`.v2_translate`.
"""

from __future__ import annotations

from typing import Any

from . import capabilities, v2_translate
from .jsonrpc import JsonObject, invalid_params
from .render import check_position

V1 = 1
V2 = 2
SUPPORTED_VERSIONS = (V1, V2)
LATEST_VERSION = V2

BROKER_INFO: JsonObject = {"name": "acp-broker", "title": "ACP Broker", "version": "0.1.0"}
REPLAY_POSITION = "_acpbroker_position"
"""``replayFrom.type`` of the broker's position cursor: ``{"type", "seq", "epoch"}``."""


def negotiate(requested: int) -> int:
    """The version a connection speaks: the client's if supported, else our latest."""
    return requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION


def initialize_result(agents: JsonObject) -> JsonObject:
    """The v2 ``initialize`` result: ``info``, ``capabilities.session`` (from what the agents
    all take, see :func:`capabilities.combined`) and no auth methods."""
    return {
        "protocolVersion": V2,
        "info": dict(BROKER_INFO),
        "capabilities": {
            "session": capabilities.v2_session_capabilities(agents),
            "_meta": dict(capabilities.EXTENSIONS_META),
        },
        "authMethods": [],
    }


def replay_after(value: Any, *, epoch: str, head: int) -> int | None:
    """The seq after which ``session/resume`` replays, from its ``replayFrom`` (None: none).

    ``{"type": "start"}`` replays everything; ``{"type": REPLAY_POSITION, "seq": n,
    "epoch": e}`` replays from the event at ``n`` inclusive (``n = head + 1``: nothing
    yet). A position of another log, ahead of it, or malformed is invalid params.
    """
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "start":
        return 0
    if kind == REPLAY_POSITION:
        assert isinstance(value, dict)
        return _position_after(value, epoch=epoch, head=head)
    if isinstance(kind, str):
        raise invalid_params(
            f"unsupported replayFrom type {kind!r}: use 'start' or {REPLAY_POSITION!r}"
        )
    raise invalid_params("replayFrom must be null or an object with a string type")


def _position_after(value: JsonObject, *, epoch: str, head: int) -> int:
    seq, given_epoch = value.get("seq"), value.get("epoch")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise invalid_params("replayFrom.seq must be an integer of at least 1")
    if not isinstance(given_epoch, str):
        raise invalid_params("replayFrom.epoch must be a string")
    check_position(seq - 1, given_epoch, log_epoch=epoch, head=head)
    return seq - 1


def result(method: str, v1: Any) -> Any:
    """A reply produced by the shared (v1-shaped) handlers, in its v2 shape."""
    if not isinstance(v1, dict):
        return v1
    if method in ("session/new", "session/fork"):
        return v2_translate.session_result(v1, keep=("sessionId",))
    if method in ("session/resume", "session/set_config_option"):
        return v2_translate.session_result(v1, keep=())
    return v1


CLIENT_METHODS = frozenset({"session/request_permission", "elicitation/create"})
"""What a v2 client answers (``fs/*`` and ``terminal/*`` are gone in v2), besides ``_`` ones."""


def client_answers(method: str) -> bool:
    """Whether a v2 client can be sent this agent request at all."""
    return method in CLIENT_METHODS or method.startswith("_")


def client_request(method: str, params: JsonObject) -> JsonObject:
    """An agent's (v1) request to a client, in the v2 shape."""
    if method == "session/request_permission":
        return v2_translate.permission_request(params)
    return params


def agent_params(params: JsonObject) -> JsonObject:
    """A v2 client's session setup params as the v1 agents take them."""
    if "mcpServers" not in params:
        return {**params, "mcpServers": []}
    return {**params, "mcpServers": v2_translate.agent_mcp_servers(params["mcpServers"])}
