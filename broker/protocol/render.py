"""How log events look on the wire to a client of a given protocol version.

Pure: an event and the viewing connection in, the JSON-RPC notification out
(or None when the event is internal). The broker's own position travels in
``_meta`` under :data:`POSITION_META`, so a v1 client can resume from exactly
where it stopped.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import fastjson
from ..model.events import EventType, JsonObject, LogEvent
from . import interactions, presence
from .jsonrpc import invalid_params, notification

POSITION_META = "acpBroker/position"
"""``_meta`` key of every ``session/update`` the broker sends: ``{"seq": n, "epoch": e}``."""
LOG_END_DATA = "acpBroker/logEnd"
"""``data`` key of the -32602 a position ahead of the session's log gets: the last position
the log gave out, ``{"seq": n, "epoch": e}`` (a client that saw events Redis then lost in a failover
resumes from there: docs/redis-recovery.md)."""
NOTICE_META = "acpBroker/notice"
"""``_meta`` key marking a notice (or its ``agent_message_chunk`` stand-in) the broker wrote,
and the stand-in of an agent's notice."""
LET_GO_META = "acpBroker/deactivated"
"""``_meta`` key of the notice that tells a client a session is no longer active on its
connection (let go for a newer one: see ``front/acp/session_lru.py``)."""
NOTICE_TITLE = "Message from the broker"
"""Title of a broker notice logged without one."""


def position_meta(event: LogEvent) -> JsonObject:
    return {POSITION_META: {"seq": event.seq, "epoch": event.epoch}}


def check_position(seq: int, epoch: str, *, log_epoch: str, head: int) -> None:
    """A position a client gives back must be of this log and not ahead of it (-32602)."""
    if epoch != log_epoch:
        raise invalid_params("the position belongs to another log (epoch mismatch)")
    if seq > head:
        raise invalid_params(
            "the position is ahead of the session's log (events after its end were lost "
            "with a Redis master, or the position is not one the broker gave)",
            {LOG_END_DATA: {"seq": head, "epoch": log_epoch}},
        )


def session_updates(event: LogEvent, session_id: str, notices: bool = False) -> list[JsonObject]:
    """The ``session/update`` notifications an event stands for, for any viewer.

    A ``prompt`` event stands for the user's message; callers decide whether
    the connection that sent it sees it again (live: no; replay: yes).
    ``notices``: the viewer advertised ``session.notices``, so notices (the
    broker's, an agent's) are sent as ``notice`` updates; other viewers get an
    ``agent_message_chunk`` marked ``_meta["acpBroker/notice"]`` instead.
    """
    updates = _updates_of(event, notices)
    meta = position_meta(event)
    return [
        notification("session/update", {"sessionId": session_id, "update": u, "_meta": meta})
        for u in updates
    ]


def session_update_frames(event: LogEvent, session_id: str, notices: bool = False) -> list[str]:
    """:func:`session_updates` as JSON text, each the very text ``jsonrpc.encode`` makes of
    it: the envelope and the position are spliced around each update's own encoding, where
    encoding the whole notification built three dicts an update (a replay makes 10,000)."""
    updates = _updates_of(event, notices)
    if not updates:
        return []
    head = _update_head(session_id)
    tail = _POSITION_SEQ + str(event.seq) + _position_tail(event.epoch)
    return [head + fastjson.dumps(update) + tail for update in updates]


_POSITION_SEQ = ',"_meta":{"' + POSITION_META + '":{"seq":'
_PLAIN_UPDATE = '{"type":"update","update":{'
UPDATE_AT = len(_PLAIN_UPDATE) - 1
"""Where a plain update's own text starts in its stored text (see :func:`plain_update`)."""


class StoredUpdates:
    """v1 frames of a log's plain updates for one session, made from the events' stored
    text without parsing them into events: a replay sends thousands.

    A plain update is stored as ``{"type":"update","update":{…}}`` and nothing else (an
    agent's update, as the agent host logs it): its frame is the envelope spliced around
    the stored update, the same JSON :func:`session_update_frames` makes of the event (the
    very text, wherever orjson wrote the event: all but the few it refuses)."""

    __slots__ = ("_head", "_tail")

    def __init__(self, session_id: str, epoch: str) -> None:
        self._head = _update_head(session_id)
        self._tail = _position_tail(epoch)

    def frame(self, text: str, seq: int) -> str | None:
        """The one frame of the event stored as ``text`` at ``seq`` when it is a plain
        update other than a notice (the same for every v1 viewer, whether it takes notices
        or not); None for any other event: render that one from the event."""
        if plain_update(text) is None:
            return None
        return self.framed(text[UPDATE_AT:-1], seq)

    def framed(self, update: str, seq: int) -> str:
        """The ``session/update`` frame of the update whose JSON text is ``update``, at
        ``seq``: the text ``jsonrpc.encode`` makes of the notification."""
        return f"{self._head}{update}{_POSITION_SEQ}{seq}{self._tail}"


def plain_update(text: str) -> JsonObject | None:
    """The update of an event stored as ``text`` when the event is a plain update other
    than a notice, its text ``{"type":"update","update":{…}}`` (so ``text[UPDATE_AT:-1]``
    is the update's own text); None for any other event.

    The text is what ``dumps`` made of a dict (the append script stores it verbatim), so
    two keys, of which the first two written are "type" and "update", mean the update is
    the rest. Parsed for that and the update's kind, not sent again."""
    if not text.startswith(_PLAIN_UPDATE):
        return None
    body = fastjson.loads_shape(text)
    if type(body) is not dict or len(body) != 2:
        return None
    update = body["update"]
    return None if update.get("sessionUpdate") == "notice" else update


@functools.lru_cache(maxsize=4096)
def _update_head(session_id: str) -> str:
    return (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":'
        + fastjson.dumps(session_id)
        + ',"update":'
    )


@functools.lru_cache(maxsize=4096)
def _position_tail(epoch: str) -> str:
    """What follows an update and its seq: the update's ``_meta`` is its position."""
    return ',"epoch":' + fastjson.dumps(epoch) + "}}}}"


def _updates_of(event: LogEvent, notices: bool) -> list[JsonObject]:
    body = event.body
    kind = body.get("type")
    if kind == EventType.UPDATE:
        update = body["update"]
        if update.get("sessionUpdate") == "notice" and not notices:
            return [notice_chunk(_notice_text(update))]
        return [update]
    if kind == EventType.PROMPT:
        return [_user_chunk(block) for block in body.get("prompt", [])]
    if kind == EventType.NOTICE:
        if notices:
            return [broker_notice(body)]
        return [notice_chunk(str(body.get("text", "")))]
    if kind in _QUEUE_EVENTS:
        return [queue_update(body)]
    if kind == EventType.INTERACTION and isinstance(body.get("interaction"), dict):
        return [interactions.info_update(body["interaction"])]
    if kind == EventType.PRESENCE:
        return presence.info_updates(body)
    if kind == EventType.SESSION_ACCESS:
        return [access_update(body)]
    return []


ACCESS_META = "acpBroker/sessionAccess"
"""``_meta`` key of the ``session_info_update`` that tells viewers the session's ACL changed."""


def access_update(body: JsonObject) -> JsonObject:
    """An ACL change as every viewer hears of it (v1 and v2): the generic access-changed
    event the draft allows (the change, the entry's id, the new revision; never the
    principal or its roles: ``session_access/list`` shows those to owners)."""
    change = {
        "change": str(body.get("change", "")),
        "entryId": str(body.get("entryId", "")),
        "aclRevision": str(body.get("aclRevision", "")),
    }
    return {"sessionUpdate": "session_info_update", "_meta": {ACCESS_META: change}}


QUEUE_META = "acpBroker/promptQueue"
"""``_meta`` key of the ``session_info_update`` that tells viewers of the prompt queue."""
_QUEUE_EVENTS = {
    EventType.PROMPT_QUEUED: "queued",
    EventType.PROMPT_WITHDRAWN: "withdrawn",
    EventType.CANCEL_IGNORED: "cancelIgnored",
}


def queue_update(body: JsonObject) -> JsonObject:
    """A prompt queued, withdrawn, or a late cancel, as every viewer hears of it (v1 and v2):
    a ``session_info_update`` whose ``_meta`` names the change and the activity (the
    prompt's id; a queued prompt's content too)."""
    change: JsonObject = {
        "change": _QUEUE_EVENTS[body["type"]],
        "activityId": str(body.get("promptId") or body.get("activityId") or ""),
    }
    if body["type"] == EventType.PROMPT_QUEUED:
        change["prompt"] = body.get("prompt", [])
    return {"sessionUpdate": "session_info_update", "_meta": {QUEUE_META: change}}


INTERACTIONS_META = "acpBroker/interactions"
"""``capabilities._meta`` key of a client that asks to be sent interaction records."""


def follows_interactions(capabilities: JsonObject) -> bool:
    """Whether a client is sent each interaction's changes (``session_info_update`` with
    ``_meta["acpBroker/interaction"]``): one that negotiated the draft
    (``capabilities.remote``), or that asked (``_meta["acpBroker/interactions"]: true``, or
    ``"acpBroker/sharedAsks"``, as the web console does). Others answer the agent's
    requests themselves and are spared the records."""
    if isinstance(capabilities.get("remote"), dict):
        return True
    meta = capabilities.get("_meta")
    return isinstance(meta, dict) and any(
        meta.get(key) is True for key in (INTERACTIONS_META, "acpBroker/sharedAsks")
    )


def is_notice(event: LogEvent) -> bool:
    """Whether an event is a notice (the broker's, or an agent's ``notice`` update): live
    only, so a replay leaves it out for viewers that get notices (the notices RFD)."""
    if event.type == EventType.NOTICE:
        return True
    update = event.body.get("update") if event.type == EventType.UPDATE else None
    return isinstance(update, dict) and update.get("sessionUpdate") == "notice"


def client_sees_notices(version: int, capabilities: JsonObject) -> bool:
    """Whether a client is sent ``notice`` updates: v2 needs no capability; v1 clients
    advertise ``session.notices``."""
    if version >= 2:
        return True
    session = capabilities.get("session")
    return isinstance(session, dict) and isinstance(session.get("notices"), dict)


def broker_notice(body: JsonObject) -> JsonObject:
    """A broker ``notice`` event as the ACP ``notice`` update (the same in v1 and v2)."""
    title = body.get("title")
    out: JsonObject = {
        "sessionUpdate": "notice",
        "severity": str(body.get("severity") or "warning"),
        "title": title if isinstance(title, str) and title else NOTICE_TITLE,
        "_meta": {NOTICE_META: True},
    }
    if body.get("text"):
        out["description"] = str(body["text"])
    return out


def notice_chunk(text: str) -> JsonObject:
    """The stand-in of a notice for a viewer that does not take notices: an agent message."""
    return {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": text},
        "_meta": {NOTICE_META: True},
    }


def _notice_text(update: JsonObject) -> str:
    title, description = str(update.get("title") or ""), update.get("description")
    return f"{title}: {description}" if isinstance(description, str) and description else title


def _user_chunk(block: Any) -> JsonObject:
    return {"sessionUpdate": "user_message_chunk", "content": block}


def origin_of(event: LogEvent) -> str | None:
    """The connection whose request produced the event, if any."""
    origin = event.body.get("origin")
    return origin if isinstance(origin, str) else None
