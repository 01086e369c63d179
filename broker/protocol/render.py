"""How log events look on the wire to a client of a given protocol version.

Pure: an event and the viewing connection in, the JSON-RPC notification out
(or None when the event is internal). The broker's own position travels in
``_meta`` under :data:`POSITION_META`, so a v1 client can resume from exactly
where it stopped.
"""

from __future__ import annotations

from typing import Any

from ..store.events import EventType, JsonObject, LogEvent
from .jsonrpc import invalid_params, notification

POSITION_META = "acpBroker/position"
"""``_meta`` key of every ``session/update`` the broker sends: ``{"seq": n, "epoch": e}``."""
NOTICE_META = "acpBroker/notice"
"""``_meta`` key marking an agent_message_chunk that the broker, not the agent, wrote."""


def position_meta(event: LogEvent) -> JsonObject:
    return {POSITION_META: {"seq": event.seq, "epoch": event.epoch}}


def check_position(seq: int, epoch: str, *, log_epoch: str, head: int) -> None:
    """A position a client gives back must be of this log and not ahead of it (-32602)."""
    if epoch != log_epoch:
        raise invalid_params("the position belongs to another log (epoch mismatch)")
    if seq > head:
        raise invalid_params("the position is ahead of the session's log")


def session_updates(event: LogEvent, session_id: str) -> list[JsonObject]:
    """The ``session/update`` notifications an event stands for, for any viewer.

    A ``prompt`` event stands for the user's message; callers decide whether
    the connection that sent it sees it again (live: no; replay: yes).
    """
    updates = _updates_of(event)
    meta = position_meta(event)
    return [
        notification("session/update", {"sessionId": session_id, "update": u, "_meta": meta})
        for u in updates
    ]


def _updates_of(event: LogEvent) -> list[JsonObject]:
    body = event.body
    kind = body.get("type")
    if kind == EventType.UPDATE:
        return [body["update"]]
    if kind == EventType.PROMPT:
        return [_user_chunk(block) for block in body.get("prompt", [])]
    if kind == EventType.NOTICE:
        return [
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": str(body.get("text", ""))},
                "_meta": {NOTICE_META: True},
            }
        ]
    return []


def _user_chunk(block: Any) -> JsonObject:
    return {"sessionUpdate": "user_message_chunk", "content": block}


def origin_of(event: LogEvent) -> str | None:
    """The connection whose request produced the event, if any."""
    origin = event.body.get("origin")
    return origin if isinstance(origin, str) else None
