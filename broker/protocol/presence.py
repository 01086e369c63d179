"""Presence: who is attached to a session, as peers may see it. Pure: no I/O.

An entry is one attachment (a window on a session): its ``attachmentId`` and
``participantId`` (session-scoped pseudonyms), an optional ``displayName`` the client chose
to share, its coarse ``roles``, its ``state`` (the draft's ``online``, or ``away`` after a
while without a request on the session) and ``lastActiveAt`` (whole seconds). Never a
token, a subject, an address or a connection id: the entry is made of those fields only.

Every change is a ``presence`` event in the session's log, which windows that follow
presence are sent as a ``session_info_update`` whose ``_meta["acpBroker/presence"]`` is
``{"change": "joined" | "left" | "state", "presenceRevision": …, "participant": entry}``;
a snapshot is ``{"change": "snapshot", "presenceRevision": …, "participants": [...]}``.
"""

from __future__ import annotations

import functools
import unicodedata
from datetime import UTC, datetime
from typing import Any

from .jsonrpc import JsonObject

META = "acpBroker/presence"
"""``_meta`` key of the presence ``session_info_update``, and of the ``initialize``
capability (``capabilities._meta``) of a window that asks to be sent it."""
ONLINE = "online"
AWAY = "away"
CHANGES = frozenset({"joined", "left", "state"})
MAX_NAME_CHARS = 64
ENTRY_FIELDS = ("attachmentId", "participantId", "displayName", "roles", "state", "lastActiveAt")
"""The only fields an entry shows (the privacy filter: whatever else is stored stays out)."""


def follows_presence(capabilities: JsonObject) -> bool:
    """Whether a window asked at ``initialize`` to be sent presence changes
    (``capabilities._meta["acpBroker/presence"]: true``; a draft client subscribes per
    attachment instead)."""
    meta = capabilities.get("_meta")
    return isinstance(meta, dict) and meta.get(META) is True


def display_name(params: JsonObject) -> str | None:
    """The name a client shares at ``initialize``: ``_meta.displayName``, else the
    ``title`` or ``name`` of its ``clientInfo`` (v1; ``info`` in v2); printable, at most 64
    characters (None: none)."""
    meta, info = params.get("_meta"), params.get("clientInfo", params.get("info"))
    for source, key in ((meta, "displayName"), (info, "title"), (info, "name")):
        value = source.get(key) if isinstance(source, dict) else None
        if isinstance(value, str):
            cleaned = "".join(c for c in value if unicodedata.category(c)[0] != "C").strip()
            if cleaned:
                return cleaned[:MAX_NAME_CHARS]
    return None


def coarse_time(at: float) -> str:
    """``at`` (Unix seconds) as an ISO 8601 UTC time, to the whole second."""
    return _second(int(at))


@functools.lru_cache(maxsize=8)
def _second(at: int) -> str:
    # Cached: a connect storm's thousands of entries fall in a few seconds.
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def entry_view(entry: JsonObject) -> JsonObject:
    """An entry as peers see it: its public fields only."""
    return {name: entry[name] for name in ENTRY_FIELDS if name in entry}


def event_body(changes: list[tuple[str, int, JsonObject]]) -> JsonObject:
    """The ``presence`` log event of ``changes`` (each ``(change, revision, entry)``), in
    order: one event for the changes a front writes at once (a connect storm's joins are a
    few events, not one a window)."""
    return {
        "type": "presence",
        "changes": [
            {"change": change, "presenceRevision": str(revision), "participant": entry_view(entry)}
            for change, revision, entry in changes
        ],
    }


def changes_of(body: JsonObject) -> list[JsonObject]:
    """A ``presence`` event's changes, each as a follower is sent it."""
    listed = body.get("changes")
    return [
        {
            "change": change.get("change"),
            "presenceRevision": str(change.get("presenceRevision", "0")),
            "participant": entry_view(_object(change.get("participant"))),
        }
        for change in (listed if isinstance(listed, list) else [])
        if isinstance(change, dict)
    ]


def info_updates(body: JsonObject) -> list[JsonObject]:
    """A ``presence`` event as the ``session_info_update``s its followers are sent, one a
    change."""
    return [
        {"sessionUpdate": "session_info_update", "_meta": {META: change}}
        for change in changes_of(body)
    ]


def snapshot_update(revision: int, entries: list[JsonObject]) -> JsonObject:
    """A whole snapshot, as the ``session_info_update`` a follower gets first."""
    change = {
        "change": "snapshot",
        "presenceRevision": str(revision),
        "participants": sorted_entries(entries),
    }
    return {"sessionUpdate": "session_info_update", "_meta": {META: change}}


def sorted_entries(entries: list[JsonObject]) -> list[JsonObject]:
    """Entries' views in a stable order (by participant, then attachment)."""
    views = [entry_view(e) for e in entries]
    return sorted(views, key=lambda e: (str(e.get("participantId")), str(e.get("attachmentId"))))


def _object(value: Any) -> JsonObject:
    return value if isinstance(value, dict) else {}
