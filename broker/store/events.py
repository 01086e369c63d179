"""Session events and the pure fold of a log into a session's snapshot (the events
themselves are :mod:`broker.model.events`, found here too).

An event body is a JSON object with a ``type``. The append script stores the
body verbatim and keeps the snapshot hash in step by applying the *snapshot
operations* that :func:`snapshot_ops` derives from the body, so the snapshot
in Redis is always ``fold(log)``; :func:`fold` is the same computation done in
Python, which is how the tests prove it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import fastjson
from ..model.events import EventRow as EventRow
from ..model.events import EventType as EventType
from ..model.events import JsonObject as JsonObject
from ..model.events import LogEvent as LogEvent
from ..model.events import Position as Position
from ..model.events import Status as Status
from ..model.events import event_of as event_of
from ..model.events import events_of as events_of
from .window import SNAPSHOT_FIELDS as WINDOW_SNAPSHOT_FIELDS
from .window import window_marked, window_of, window_ops

SnapshotOp = tuple[str, str, str]

ACL_PREFIX = "acl:"
"""Snapshot fields ``acl:<entryId>``: the session's ACL entries (JSON), one field each, so
that grants to different principals, from any front, never overwrite each other."""
ACL_REVISION = "aclRev"


@dataclass(slots=True)
class SessionSnapshot:
    """The current state of a session: ``fold`` of its log."""

    tenant: str
    session_id: str
    epoch: str
    seq: int
    created_ms: int
    updated_ms: int
    cwd: str = ""
    additional_directories: list[str] = field(default_factory=list)
    agent: str = ""
    kind: str = ""
    title: str | None = None
    updated_at: str | None = None  # an explicit updatedAt set by session_info_update
    status: str = Status.RUNNING
    agent_session_id: str | None = None
    prompt_id: str | None = None  # the prompt running now, if any
    meta: JsonObject = field(default_factory=dict)
    window: JsonObject = field(default_factory=dict)  # modes, configOptions, models: window.py
    archived: bool = False  # the log is in the archive store (and the window left out)
    floor: int = 0  # a seq handed out that a failover lost: the next one is past it (floors.py)
    acl: dict[str, str] = field(default_factory=dict)
    """The session's ACL: each entry's JSON by entry id (``auth.roles.AclEntry``)."""
    acl_revision: int = 0
    """How many ACL changes the log holds (the draft's ``aclRevision``)."""
    interactions: list[JsonObject] = field(default_factory=list)
    """The pending interactions (``open`` or ``claimed``) the log leaves, each its last
    logged record: what a host taking the session over ends (their agent is gone)."""

    @classmethod
    def from_hashes(
        cls,
        snap: Mapping[str, str],
        meta: Mapping[str, str],
        *,
        tenant: str | None = None,
        session_id: str | None = None,
    ) -> SessionSnapshot:
        """Build a snapshot from the snapshot hash and the metadata hash. ``tenant`` and
        ``session_id`` (the key's) stand in for the hash's own ``tenant`` and ``sid``, which
        an archived session's snapshot leaves out (``lua/archive_trim.lua``); it holds the
        metadata's fields too, as ``m:<name>``."""
        return cls(
            tenant=snap.get("tenant") or _given(tenant, "tenant"),
            session_id=snap.get("sid") or _given(session_id, "sid"),
            epoch=snap["epoch"],
            seq=int(snap["seq"]),
            created_ms=int(snap["created"]),
            updated_ms=int(snap.get("updated", snap["created"])),
            cwd=snap.get("cwd", ""),
            additional_directories=json.loads(snap.get("dirs", "[]")),
            agent=snap.get("agent", ""),
            kind=snap.get("kind", ""),
            title=snap.get("title"),
            updated_at=snap.get("updatedAt"),
            status=snap.get("status", Status.RUNNING),
            agent_session_id=snap.get("agentSid"),
            prompt_id=snap.get("prompt"),
            meta={key: json.loads(value) for key, value in _user_meta(snap, meta).items()},
            window=window_of(snap),
            archived="archived" in snap,
            floor=int(snap.get("floor", 0)),
            acl={k[len(ACL_PREFIX) :]: v for k, v in snap.items() if k.startswith(ACL_PREFIX)},
            acl_revision=int(snap.get(ACL_REVISION, 0)),
            interactions=[
                json.loads(value)
                for key, value in snap.items()
                if key.startswith(INTERACTION_FIELD_PREFIX)
            ],
        )

    @property
    def deleted(self) -> bool:
        return self.status == Status.DELETED

    @property
    def given(self) -> int:
        """The highest seq of this log a client may hold: the stored seq, or past it the
        floor a watcher left when a failover lost events it had handed out."""
        return max(self.seq, self.floor)


_ACTIVITY = frozenset(
    {EventType.CREATED, EventType.UPDATE, EventType.PROMPT, EventType.PROMPT_END, EventType.DELETED}
)


def is_activity(body: Mapping[str, Any]) -> bool:
    """Whether an event is activity in the session (moves ``updatedAt``); the broker's own
    bookkeeping (status, agent binding, notices) is not."""
    return body.get("type") in _ACTIVITY


INTERACTION_FIELD_PREFIX = "i:"
"""Snapshot fields ``i:<interactionId>``: a pending interaction's last record (JSON),
removed when it ends."""
_PENDING_INTERACTION_STATES = frozenset({"open", "claimed"})

_UNLISTED_FIELDS = frozenset({"prompt", "agentSid", ACL_REVISION, *WINDOW_SNAPSHOT_FIELDS})
"""Snapshot fields no listing shows (see ``index.row_of``; the ACL's ``acl:*`` and the
pending interactions' ``i:*`` neither)."""


def is_index_neutral(body: Mapping[str, Any], ops: Iterable[SnapshotOp] | None = None) -> bool:
    """Whether an event changes nothing the session index shows but the session's seq and,
    for activity, its ``updatedAt`` (and with it its place in the ACP listings): most agent
    updates. Its change-feed notice says so (``lua/append.lua``), and a projector then
    patches the index without reading the snapshot (``SessionIndex.touch_many``).
    ``ops`` are the event's :func:`snapshot_ops`, when already made."""
    if body.get("type") in (EventType.CREATED, EventType.DELETED, EventType.STATUS):
        return False
    found = snapshot_ops(body) if ops is None else ops
    return all(op in ("set", "del") and _unlisted(name) for op, name, _ in found)


def _unlisted(name: str) -> bool:
    return name in _UNLISTED_FIELDS or name.startswith((ACL_PREFIX, INTERACTION_FIELD_PREFIX))


def snapshot_ops(body: Mapping[str, Any]) -> list[SnapshotOp]:
    """The snapshot operations an event implies (see ``lua/append.lua``)."""
    kind = body.get("type")
    if kind == EventType.CREATED:
        return _created_ops(body)
    if kind == EventType.UPDATE:
        update = body.get("update") or {}
        if update.get("sessionUpdate") == "session_info_update":
            return _info_ops(update)
        return window_ops(body)
    if kind == EventType.WINDOW:
        return window_ops(body)
    if kind == EventType.PROMPT:
        return [("set", "prompt", str(body["promptId"]))]
    if kind == EventType.PROMPT_END:
        return [("del", "prompt", "")]
    if kind == EventType.STATUS:
        return [("set", "status", str(body["status"]))]
    if kind == EventType.BOUND:
        return [("set", "agentSid", str(body["agentSessionId"]))]
    if kind == EventType.DELETED:
        return [("set", "status", Status.DELETED), ("del", "prompt", "")]
    if kind == EventType.SESSION_ACCESS:
        return _access_ops(body)
    if kind == EventType.INTERACTION:
        return _interaction_ops(body.get("interaction") or {})
    return []


def _access_ops(body: Mapping[str, Any]) -> list[SnapshotOp]:
    """An ACL change: the entry's field set (a grant) or deleted (a revoke), the revision."""
    name = ACL_PREFIX + str(body["entryId"])
    revision = ("set", ACL_REVISION, str(body["aclRevision"]))
    if body.get("change") == "revoke":
        return [("del", name, ""), revision]
    return [("set", name, dumps(body["entry"])), revision]


def _interaction_ops(record: Mapping[str, Any]) -> list[SnapshotOp]:
    """A pending interaction is kept in the snapshot until it ends, so that a host taking
    the session over finds what the lost one left waiting without reading the log."""
    name = f"{INTERACTION_FIELD_PREFIX}{record.get('interactionId', '')}"
    state = (record.get("state") or {}).get("type")
    if state in _PENDING_INTERACTION_STATES:
        return [("set", name, dumps(record))]
    return [("del", name, "")]


def _created_ops(body: Mapping[str, Any]) -> list[SnapshotOp]:
    ops: list[SnapshotOp] = [
        ("set", "cwd", str(body["cwd"])),
        ("set", "dirs", dumps(body.get("additionalDirectories") or [])),
        ("set", "agent", str(body.get("agent", ""))),
        ("set", "kind", str(body.get("kind", ""))),
        ("set", "status", Status.RUNNING),
    ]
    for key, value in (body.get("meta") or {}).items():
        ops.append(("mset", key, dumps(value)))
    return ops


def _info_ops(update: Mapping[str, Any]) -> list[SnapshotOp]:
    """``session_info_update``: omitted = unchanged, null clears, ``_meta`` patches by key."""
    ops: list[SnapshotOp] = []
    for name, snap_field in (("title", "title"), ("updatedAt", "updatedAt")):
        if name in update:
            value = update[name]
            ops.append(
                ("del", snap_field, "") if value is None else ("set", snap_field, str(value))
            )
    if "_meta" in update:
        patch = update["_meta"]
        if patch is None:
            ops.append(("mclear", "", ""))
        else:
            for key, value in patch.items():
                ops.append(("mdel", key, "") if value is None else ("mset", key, dumps(value)))
    return ops


def apply_ops(snap: dict[str, str], meta: dict[str, str], ops: Iterable[SnapshotOp]) -> None:
    """Apply snapshot operations to in-memory hashes, exactly as the append script does."""
    for op, name, value in ops:
        if op == "set":
            snap[name] = value
        elif op == "del":
            snap.pop(name, None)
        elif op == "mset":
            meta[name] = value
        elif op == "mdel":
            meta.pop(name, None)
        elif op == "mclear":
            meta.clear()


def _user_meta(snap: Mapping[str, str], meta: Mapping[str, str]) -> Mapping[str, str]:
    """The metadata hash, with the fields an archived snapshot holds as ``m:<name>``: only
    one marked ``archived`` holds any (``lua/archive_trim.lua`` folds them in as it sets the
    mark, ``lua/restore.lua`` moves them back as it clears it), so no other is scanned."""
    if "archived" not in snap:
        return meta
    folded = {key[2:]: value for key, value in snap.items() if key.startswith("m:")}
    return {**folded, **meta} if folded else meta


def _given(value: str | None, name: str) -> str:
    if value is None:
        raise KeyError(name)
    return value


def fold(tenant: str, session_id: str, events: Iterable[LogEvent]) -> SessionSnapshot | None:
    """The snapshot a log folds into; ``None`` for an empty log."""
    snap: dict[str, str] = {}
    meta: dict[str, str] = {}
    for event in events:
        if not snap:
            snap.update(tenant=tenant, sid=session_id, epoch=event.epoch, created=str(event.ts))
        snap["seq"] = str(event.seq)
        if is_activity(event.body):
            snap["updated"] = str(event.ts)
        apply_ops(snap, meta, snapshot_ops(event.body))
    return SessionSnapshot.from_hashes(snap, meta) if snap else None


def window_fields(events: Iterable[str]) -> dict[str, str]:
    """The snapshot fields (``w:*``) a log's events, JSON texts in seq order, leave the
    window in: what the append script set, for an archived snapshot, which leaves them out."""
    fields: dict[str, str] = {}
    for text in events:
        if window_marked(text):  # most events say nothing of it: not parsed
            apply_ops(fields, {}, window_ops(fastjson.loads(text)))
    return fields


def dumps(value: Any) -> str:
    """Compact JSON, as stored in the log and sent on the wire."""
    return fastjson.dumps(value)
