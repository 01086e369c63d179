"""How log events look on the wire to an ACP v2 client.

Pure: an event, the session id and the *turn* in effect (the seq of the
``prompt`` event whose foreground work is running, or None) in, the
``session/update`` notifications out. Everything v2 needs and the v1 agent
does not say is derived from the log, so a replay renders exactly what the
live stream rendered:

- a ``prompt`` is the ``user_message`` (id from its epoch and seq) and
  ``state_update: running``; its ``prompt_end`` is ``state_update: idle`` with
  the stop reason; a ``state`` event (the agent waits on a client) is
  ``requires_action`` and then ``running`` again;
- the agent's chunks during a turn share one ``messageId`` per role (reply,
  thought), derived from the turn; outside a turn, from their own seq;
- a broker notice is a ``notice`` update (v2 clients need no capability for
  notices); an agent's ``notice`` passes through.

Every notification carries the broker position in ``_meta`` as v1 does.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import fastjson
from ..model.events import EventType, LogEvent
from . import interactions, presence, v2_translate
from .jsonrpc import JsonObject, notification
from .render import (
    UPDATE_AT,
    StoredUpdates,
    access_update,
    broker_notice,
    plain_update,
    position_meta,
    queue_update,
)
from .turns import QUEUED_SEQ

ERROR_STOP_REASON = "error"
"""Stop reason of a turn that ended in an error (the agent failed); v2's ``ErrorStopReason``
carries the JSON-RPC error beside it, in ``error``."""
FRAME_KEY = "v2"


def frame_key(turn: int | None) -> str:
    """The key of an event's cached v2 frames: they depend on the turn in effect."""
    return f"{FRAME_KEY}:{turn}"


def session_updates(event: LogEvent, session_id: str, turn: int | None) -> list[JsonObject]:
    """The v2 ``session/update`` notifications an event stands for."""
    meta = position_meta(event)
    return [
        notification("session/update", {"sessionId": session_id, "update": u, "_meta": meta})
        for u in updates_of(event, turn)
    ]


def updates_of(event: LogEvent, turn: int | None) -> list[JsonObject]:
    """The v2 update payloads of one event (none for internal events)."""
    body, kind = event.body, event.type
    if kind == EventType.UPDATE and isinstance(body.get("update"), dict):
        translated = v2_translate.update(
            body["update"],
            lambda role, own: message_id(event, role, turn, own),
            plan_id(event),
        )
        return [translated] if translated is not None else []
    if kind == EventType.PROMPT:
        return [_user_message(event), state_update("running")]
    if kind == EventType.PROMPT_END:
        return [_idle(event)]
    if kind == EventType.STATE and isinstance(body.get("state"), str):
        return [state_update(body["state"])]
    if kind == EventType.NOTICE:
        return [broker_notice(body)]
    if kind in (EventType.PROMPT_QUEUED, EventType.PROMPT_WITHDRAWN, EventType.CANCEL_IGNORED):
        return [queue_update(body)]
    if kind == EventType.INTERACTION and isinstance(body.get("interaction"), dict):
        return [interactions.info_update(body["interaction"])]
    if kind == EventType.PRESENCE:
        return presence.info_updates(body)
    if kind == EventType.SESSION_ACCESS:
        return [access_update(body)]
    return []


def message_id(event: LogEvent, role: str, turn: int | None, own: str | None = None) -> str:
    """A stable, unique message id: the log's epoch, the turn (or the event's seq), the role.

    An id the agent gave its chunk is kept, scoped to the turn, so messages it
    separates stay separate.
    """
    return _message_id(event.epoch, event.seq, role, turn, own)


def _message_id(epoch: str, seq: int, role: str, turn: int | None, own: str | None) -> str:
    base = f"msg_{epoch}_{turn if turn is not None else seq}_{role}"
    return base if own is None else f"{base}_{own}"


class StoredChunks:
    """v2 frames of a log's plain message chunks for one session, made from the events'
    stored text without parsing them into events, as :class:`~.render.StoredUpdates`
    makes v1's: chunks are most of a history, and a v2 replay rendered each from its event
    (parsed, translated, encoded) at 2.6 times a v1 replay's time.

    A chunk's v2 update is its v1 update with the ``messageId`` of its turn added last
    (:func:`updates_of`), so its frame is its stored text with that one member spliced in.
    A chunk that carries an id of its own, and any other event, is rendered from the event.
    """

    __slots__ = ("_epoch", "_stored")

    def __init__(self, session_id: str, epoch: str) -> None:
        self._epoch = epoch
        self._stored = StoredUpdates(session_id, epoch)

    def frame(self, text: str, seq: int, turn: int | None) -> str | None:
        """The one frame of the event stored as ``text`` at ``seq``, in ``turn``, when it is
        a plain message chunk without an id of its own; None for any other event. (A plain
        update leaves the turn as it was: the caller's ``turn`` holds after it too.)"""
        update = plain_update(text)
        if update is None or "messageId" in update:
            return None
        kind = update.get("sessionUpdate")
        role = v2_translate.MESSAGE_CHUNKS.get(kind) if isinstance(kind, str) else None
        if role is None:
            return None
        message = fastjson.dumps(_message_id(self._epoch, seq, role, turn, None))
        return self._stored.framed(f'{text[UPDATE_AT:-2]},"messageId":{message}}}', seq)


def plan_id(event: LogEvent) -> str:
    """v1 has one plan per session, so one v2 plan id per log."""
    return f"plan_{event.epoch}"


def state_update(state: str, **fields: object) -> JsonObject:
    return {"sessionUpdate": "state_update", "state": state, **fields}


def user_message_id(prompt: LogEvent) -> str:
    """The ``messageId`` of the user message a ``prompt`` event inserted (v2 prompt replies
    and ``user_message`` updates carry it); a ``prompt_queued`` event's is the same as its
    prompt's once it runs."""
    queued = prompt.body.get(QUEUED_SEQ)
    return message_id(prompt, "user", queued if isinstance(queued, int) else prompt.seq)


def _user_message(event: LogEvent) -> JsonObject:
    content = event.body.get("prompt")
    return {
        "sessionUpdate": "user_message",
        "messageId": user_message_id(event),
        "content": content if isinstance(content, list) else [],
    }


def _idle(event: LogEvent) -> JsonObject:
    body = event.body
    if isinstance(body.get("error"), dict):
        return state_update("idle", stopReason=ERROR_STOP_REASON, error=_error(body["error"]))
    reason = body.get("stopReason")
    if isinstance(reason, str):
        return state_update("idle", stopReason=reason)
    return state_update("idle")


def _error(error: JsonObject) -> JsonObject:
    """A logged JSON-RPC error as the v2 ``Error`` object (an integer code and a message)."""
    code = error.get("code")
    out: JsonObject = {
        "code": code if isinstance(code, int) and not isinstance(code, bool) else -32603,
        "message": str(error.get("message", "")),
    }
    if error.get("data") is not None:
        out["data"] = error["data"]
    return out


# -- the turn in effect ---------------------------------------------------------------------


def next_turn(event: LogEvent, turn: int | None) -> int | None:
    """The turn in effect after ``event``: a prompt opens one, its end closes it."""
    if event.type == EventType.PROMPT:
        return event.seq
    if event.type == EventType.PROMPT_END:
        return None
    return turn


def open_turn(events: Sequence[LogEvent]) -> tuple[bool, int | None]:
    """Scan consecutive events backwards from the last: (found a prompt boundary, the turn).

    Not found means the turn is decided by the events before these.
    """
    found, turn, _ = turn_state(events)
    return found, turn


def turn_state(
    events: Sequence[LogEvent], state: str | None = None
) -> tuple[bool, int | None, str | None]:
    """As :func:`open_turn`, with the open turn's state after the last event: ``running`` or
    the latest ``state`` event's (``state``: what later events already said, when the scan
    goes on from events that came after these); None when no turn is open."""
    for event in reversed(events):
        if event.type == EventType.STATE and state is None:
            state = str(event.body.get("state"))
        elif event.type in (EventType.PROMPT, EventType.PROMPT_END):
            turn = next_turn(event, None)
            return True, turn, (state or "running") if turn is not None else None
    return False, None, state
