"""A session's window: its modes, config options and models as the agent last stated them.

An editor window that opens (or reopens) a session needs them to show its mode switcher
and option menus; the agent states them in its replies (``session/new``, ``load``,
``resume``, ``fork``, ``set_config_option``) and changes them with ``current_mode_update``
and ``config_option_update`` notifications. The agent host logs what a reply said as a
``window`` event (:func:`window_event`); those events and the agent's notifications fold
into fields of the session's snapshot hash (:func:`window_ops`), so that any front answers
a ``session/load`` or ``session/resume`` with the session's current window
(:func:`window_of`), whether or not an agent process already holds the session. An
archived session's snapshot leaves those fields out (they would turn its hash from a
listpack into a hash table, ``lua/archive_trim.lua``): its window is folded again from its
archived log (:func:`window_fields`) when the log is restored, or read. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .. import fastjson

__all__ = [
    "WINDOW_FIELDS",
    "window_event",
    "window_marked",
    "window_of",
    "window_ops",
    "with_window",
]

JsonObject = dict[str, Any]
SnapshotOp = tuple[str, str, str]

WINDOW_FIELDS: Final = ("modes", "configOptions", "models")
"""The reply fields that make a window (ACP ``SessionModeState``, ``SessionConfigOption[]``,
and the unstable ``SessionModelState`` of agents that state one)."""
WINDOW_TYPE: Final = "window"
"""``type`` of the event that logs what an agent's reply said of the window."""
MODE_ID: Final = "modeId"
"""A ``window`` event's key for a mode the client set (``session/set_mode`` replies ``{}``)."""
_PREFIX: Final = "w:"
SNAPSHOT_FIELDS: Final = frozenset(
    {*(_PREFIX + name for name in WINDOW_FIELDS), _PREFIX + "currentModeId"}
)
"""The snapshot hash fields a window is kept in (no listing shows them)."""
_MARKERS: Final = (WINDOW_TYPE, "current_mode_update", "config_option_update")
"""Words an event's JSON holds when :func:`window_ops` has anything to say of it."""


def window_marked(text: str) -> bool:
    """Whether an event's JSON text may say anything of the window (False: it does not,
    and need not be parsed to fold the window)."""
    return any(marker in text for marker in _MARKERS)


def window_event(reply: Any, *, mode_id: str | None = None) -> JsonObject | None:
    """The ``window`` event body for what an agent's reply said (None: it said nothing of
    the window); ``mode_id``: the mode a successful ``session/set_mode`` chose."""
    window: JsonObject = {}
    if isinstance(reply, dict):
        window = {name: reply[name] for name in WINDOW_FIELDS if reply.get(name) is not None}
    if mode_id is not None:
        window[MODE_ID] = mode_id
    return {"type": WINDOW_TYPE, "window": window} if window else None


def window_ops(body: Mapping[str, Any]) -> list[SnapshotOp]:
    """The snapshot operations of an event for the window: a ``window`` event's fields, a
    ``current_mode_update``'s mode, a ``config_option_update``'s options."""
    kind = body.get("type")
    if kind == WINDOW_TYPE:
        return _window_event_ops(body.get("window") or {})
    if kind != "update":
        return []
    update = body.get("update") or {}
    which = update.get("sessionUpdate")
    if which == "current_mode_update" and isinstance(update.get("currentModeId"), str):
        return [("set", _PREFIX + "currentModeId", update["currentModeId"])]
    if which == "config_option_update" and isinstance(update.get("configOptions"), list):
        return [("set", _PREFIX + "configOptions", fastjson.dumps(update["configOptions"]))]
    return []


def _window_event_ops(window: Mapping[str, Any]) -> list[SnapshotOp]:
    ops: list[SnapshotOp] = []
    for name in WINDOW_FIELDS:
        if name in window:
            ops.append(("set", _PREFIX + name, fastjson.dumps(window[name])))
    if "modes" in window:  # a whole mode state: its current mode is the current one now
        ops.append(("del", _PREFIX + "currentModeId", ""))
    if isinstance(window.get(MODE_ID), str):
        ops.append(("set", _PREFIX + "currentModeId", window[MODE_ID]))
    return ops


def window_of(snap: Mapping[str, str]) -> JsonObject:
    """The window a snapshot hash keeps: ``modes`` (with the current mode as it last
    changed), ``configOptions``, ``models``; the fields never stated are left out."""
    window: JsonObject = {}
    for name in WINDOW_FIELDS:
        text = snap.get(_PREFIX + name)
        if text is not None:
            window[name] = fastjson.loads(text)
    current = snap.get(_PREFIX + "currentModeId")
    modes = window.get("modes")
    if current is not None and isinstance(modes, dict):
        window["modes"] = {**modes, "currentModeId": current}
    return window


def with_window(reply: Any, window: Mapping[str, Any]) -> Any:
    """An agent's reply to a load or resume, whole: the window's fields it left out (an
    agent already holding the session replies ``{}``) taken from the session's window."""
    if not isinstance(reply, dict) or not window:
        return reply
    return {**{k: v for k, v in window.items() if reply.get(k) is None}, **_stated(reply)}


def _stated(reply: JsonObject) -> JsonObject:
    return {k: v for k, v in reply.items() if not (k in WINDOW_FIELDS and v is None)}
