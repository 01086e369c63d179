"""A session's log events as every part sees them: their types, positions and rows.

How a log folds into a session's snapshot, and how it is kept in Redis, is the store's
(:mod:`broker.store.events`); how an event is shown to a client, the protocol's
(:mod:`broker.protocol.render`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .. import fastjson

JsonObject = dict[str, Any]


class EventType(StrEnum):
    """What an event in a session's log records."""

    CREATED = "created"  # session/new: cwd, roots, agent, kind, user metadata
    UPDATE = "update"  # a session/update payload, from the agent or made by the broker
    PROMPT = "prompt"  # a prompt accepted: its content and the connection that sent it
    PROMPT_END = "prompt_end"  # that prompt finished: stopReason, or an error
    STATUS = "status"  # the session's status changed (RUNNING, STOPPED, ERROR)
    BOUND = "bound"  # an agent process took the session: the agent's own session id
    NOTICE = "notice"  # something the broker tells the session's viewers
    STATE = "state"  # the running prompt waits on a client (requires_action) or runs again
    DELETED = "deleted"  # session/delete
    WINDOW = "window"  # what an agent's reply said of modes, config options, models
    PROMPT_QUEUED = "prompt_queued"  # a prompt that came while a turn ran: waits its turn
    PROMPT_WITHDRAWN = "prompt_withdrawn"  # a queued prompt cancelled before its turn
    CANCEL_IGNORED = "cancel_ignored"  # a cancel of an activity not there to cancel
    INTERACTION = "interaction"  # a pending interaction's new state (opened, claimed, resolved…)
    PRESENCE = "presence"  # an attachment joined, left, or went away (idle) or back online
    SESSION_ACCESS = "session_access"  # an ACL entry granted (or replaced) or revoked


class Status(StrEnum):
    """A session's status, as listed by the REST and MCP session lists."""

    RUNNING = "RUNNING"  # an agent process holds the session
    STOPPED = "STOPPED"  # no agent process holds it; load or resume brings it back
    ERROR = "ERROR"  # the agent process that held it failed
    DELETED = "DELETED"  # session/delete; kept in the log, hidden from session/list


@dataclass(frozen=True, slots=True)
class Position:
    """Where an append landed: ``seq`` within log ``epoch``."""

    seq: int
    epoch: str


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One entry of a session's log, at position ``seq`` of log ``epoch``."""

    seq: int
    epoch: str
    ts: int
    body: JsonObject
    frames: dict[str, list[str]] = field(default_factory=dict, compare=False, repr=False)
    """Wire frames of this event, rendered once and shared by every connection."""
    type: str = field(init=False, compare=False, repr=False)
    """The body's ``type``: read once, since a fan-out asks for it at every connection."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", str(self.body.get("type", "")))


EventRow = tuple[int, int, str]
"""One log entry as stored, before its body is parsed: ``(seq, ts, event JSON text)``, as an
archive keeps it too."""


def event_of(row: EventRow, epoch: str) -> LogEvent:
    """The event of a stored row of log ``epoch``, its body parsed."""
    seq, ts, text = row
    return LogEvent(seq, epoch, ts, fastjson.loads(text))


def events_of(rows: Iterable[EventRow], epoch: str) -> list[LogEvent]:
    """:func:`event_of` each row."""
    return [event_of(row, epoch) for row in rows]
