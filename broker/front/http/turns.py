"""A prompt turn as the session tools report it, read from the session's log.

Pure: :func:`turn_report` folds the events of one turn (from its ``prompt`` event to
its ``prompt_end``) into a :class:`TurnReport`, which :meth:`TurnReport.text_lines`
renders for a model (MCP) and :meth:`TurnReport.document` for a script (REST).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from ...store.events import EventType, JsonObject, LogEvent
from .tool_outputs import TurnReply

STILL_RUNNING = "still running"
QUEUED = "queued: it runs once the turns before it have ended"
WAITING_STATE = "requires_action"
"""The ``state`` event an agent host logs while a turn waits on a client (a permission)."""


@dataclass
class TurnReport:
    """What one turn produced so far."""

    prompt_id: str
    started: bool = False
    """Its ``prompt`` event is in the log (the host took it)."""
    queued: bool = False
    """It waits in the session's queue for the turns before it (``prompt_queued``)."""
    chunks: list[str] = field(default_factory=list)
    tools: dict[str, JsonObject] = field(default_factory=dict)
    """Each tool call by its id: its latest title, kind and status."""
    ended: bool = False
    stop_reason: str | None = None
    error: str | None = None
    waiting: bool = False
    """It waits for a person (an agent's question is open in the windows)."""

    @property
    def text(self) -> str:
        """The agent's reply: its message chunks joined."""
        return "".join(self.chunks)

    @property
    def state(self) -> Literal["ended", "queued", "running", "waiting"]:
        """``ended``, ``waiting`` (for a person), ``queued`` (behind other turns) or
        ``running``."""
        if self.ended:
            return "ended"
        if self.queued and not self.started:
            return "queued"
        return "waiting" if self.waiting else "running"

    def tool_lines(self) -> list[str]:
        """One line per tool call: ``tool call: TITLE (KIND, STATUS)``."""
        lines = []
        for call_id, call in self.tools.items():
            title = call.get("title") or call_id
            details = ", ".join(str(call[k]) for k in ("kind", "status") if call.get(k))
            lines.append(f"tool call: {title}" + (f" ({details})" if details else ""))
        return lines

    def text_lines(self, live_view_url: str) -> list[str]:
        """The reply as a tool result: the text, the tool calls, then ``stop reason: …``
        (or, for a turn that outlived the wait, ``still running``)."""
        lines = [self.text] if self.text else []
        lines += self.tool_lines()
        if self.error is not None:
            lines.append(f"error: {self.error}")
        if self.ended:
            lines.append(f"stop reason: {self.stop_reason or 'error'}")
            return lines
        if self.waiting:
            lines.append(
                "waiting for a person: the agent asked a question (a permission) that a person "
                f"must answer in the live view: {live_view_url}"
            )
        if self.state == "queued":  # what session_cancel's activityId withdraws it by
            lines.append(f"activity: {self.prompt_id}")
        lines.append(QUEUED if self.state == "queued" else STILL_RUNNING)
        return lines

    def document(self) -> TurnReply:
        """The reply as REST answers it."""
        return {
            "activityId": self.prompt_id,
            "text": self.text,
            "toolCalls": self.tool_lines(),
            "state": self.state,
            "stopReason": self.stop_reason if self.ended else None,
            "error": self.error,
        }


_QUEUE_FACTS = (EventType.PROMPT_QUEUED, EventType.PROMPT_WITHDRAWN)


def turn_report(prompt_id: str, events: Iterable[LogEvent]) -> TurnReport:
    """The turn ``prompt_id`` as far as ``events`` (in seq order) tell it."""
    report = TurnReport(prompt_id)
    for event in events:
        see(report, event)
        if report.ended:
            break
    return report


def see(report: TurnReport, event: LogEvent) -> None:
    """Fold one event into the report (events before the turn's ``prompt`` are not its)."""
    body, kind = event.body, event.type
    if kind == EventType.PROMPT and body.get("promptId") == report.prompt_id:
        report.started = True
    elif kind in _QUEUE_FACTS and body.get("promptId") == report.prompt_id:
        report.queued = True
        if kind == EventType.PROMPT_WITHDRAWN:  # cancelled before its turn
            report.ended, report.stop_reason = True, "cancelled"
    elif not report.started or report.ended:
        return
    elif kind == EventType.UPDATE:
        _update(report, body.get("update"))
    elif kind == EventType.STATE:
        report.waiting = body.get("state") == WAITING_STATE
    elif kind == EventType.PROMPT_END and body.get("promptId") == report.prompt_id:
        report.ended, report.waiting = True, False
        report.stop_reason = body.get("stopReason") or (body.get("result") or {}).get("stopReason")
        error = body.get("error")
        if isinstance(error, dict):
            report.error = str(error.get("message") or "the turn failed")


def _update(report: TurnReport, update: object) -> None:
    if not isinstance(update, dict):
        return
    kind = update.get("sessionUpdate")
    if kind == "agent_message_chunk":
        content = update.get("content")
        if isinstance(content, dict) and content.get("type") == "text":
            report.chunks.append(str(content.get("text", "")))
    elif kind in ("tool_call", "tool_call_update"):
        call = report.tools.setdefault(str(update.get("toolCallId")), {})
        call.update({k: update[k] for k in ("title", "kind", "status") if update.get(k)})
