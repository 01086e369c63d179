"""The session tools beside ``session_list``: what ``tools/list`` shows and how each answers.

Each tool is a :class:`SessionTool`: its name, title, description and truthful
annotations, the scope it needs, its input model (:mod:`.tool_models`: the tool's
``inputSchema`` and the check of every call's arguments) and its handler over
:class:`.session_tools.SessionTools`, which gets the checked inputs. A new tool is a model
there, and a handler and a line of :func:`tool_set` here.

A result is text for a model: a session's line (``ID  STATUS  KIND  CREATED``, as
``session_list`` writes it), ``live view: URL``, and for a prompt the turn's reply
(:meth:`~.turns.TurnReport.text_lines`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import mcp_types as types

from ...auth.principal import Principal, Scope
from ...auth.roles import Permission
from ...store.events import JsonObject
from ..approval import API_SCOPE
from .interaction_tools import InteractionTools
from .presence_tools import PresenceTools, presence_lines
from .session_tools import SessionTools, SessionView, TurnView
from .tool_inputs import ToolInput, input_schema
from .tool_models import (
    CreateSessionTool,
    InteractionRespond,
    OperationInput,
    SessionCancel,
    SessionChange,
    SessionPrompt,
    SessionRef,
)

InputT = TypeVar("InputT", bound=ToolInput)
LineRenderer = Callable[[list[JsonObject]], list[str]]


@dataclass(frozen=True, slots=True)
class SessionTool(Generic[InputT]):
    """One tool: its definition, its input model, its handler ``(tools, caller, inputs,
    live view base) -> the result's text``, the scope a caller needs and the permission it
    needs on the session it names (``id``; None: it names none)."""

    name: str
    title: str
    description: str
    inputs: type[InputT]
    handler: Callable[[SessionTools, Principal, InputT, str], Awaitable[str]]
    scope: Scope = Scope.WRITE
    permission: Permission | None = None
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False
    repeatable: bool = True
    """A mutation whose first call died mid-way is run again by a retry with its
    ``operationId`` (False: the retry hears its outcome is unknown)."""

    @property
    def mutation(self) -> bool:
        """Whether the tool changes something (its inputs take an ``operationId``)."""
        return issubclass(self.inputs, OperationInput)

    @property
    def tool(self) -> types.Tool:
        """The tool as ``tools/list`` shows it."""
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=input_schema(self.inputs),
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=self.open_world,
            ),
        )

    async def run(self, tools: SessionTools, caller: Principal, inputs: InputT, base: str) -> str:
        """The call (its inputs checked already: :meth:`ToolInput.parse`): the caller's roles
        on the session it names (``forbidden``), then handled."""
        session_id = getattr(inputs, "id", None)
        if self.permission is not None and isinstance(session_id, str):
            await tools.require(caller, session_id, self.permission, self.name)
        return await self.handler(tools, caller, inputs, base)


def session_text(view: SessionView, line: LineRenderer) -> str:
    """A session's line and its live view URL."""
    return "\n".join([*line([view.row]), f"live view: {view.live_view_url}"])


def interaction_lines(listed: list[JsonObject]) -> list[str]:
    """Interactions for a model: a line each (id, kind, state, revision, and who claimed or
    answered it), its question as JSON, its options."""
    lines: list[str] = []
    for item in listed:
        who = item.get("resolvedBy") or item.get("claimedBy")
        lines.append(
            f"{item['id']}  {item['kind']}  {item['state']}  revision {item['revision']}"
            + (f"  by {who}" if who else "")
        )
        question = {k: v for k, v in item.get("request", {}).items() if k != "options"}
        lines.append(f"  question: {json.dumps(question, ensure_ascii=False)}")
        for option in item.get("options", []):
            if isinstance(option, dict):
                lines.append(f"  option {option.get('optionId')}: {option.get('name', '')}")
    return lines


def turn_text(turn: TurnView) -> str:
    return "\n".join(turn.report.text_lines(turn.live_view_url))


CREATE = (
    "Starts a new session on an agent, as an editor's session/new does, and optionally runs a "
    "first prompt in it. Returns the session's line (id, status, kind, creation time) and its "
    "live view URL, where a person can watch it; with a prompt, the agent's reply and the stop "
    "reason. The session is an ordinary one: editors and the web console can open it."
)
RESUME = (
    "Brings a STOPPED or ERROR session back onto an agent process (RUNNING), nothing lost; on "
    "a running session it does nothing. Returns the session's line and its live view URL."
)
PROMPT = (
    "Runs one turn: sends text to the session's agent and returns its reply (the message text, "
    "each tool call on a line, then `stop reason: …`). A turn that outlives wait goes on; the "
    "result then ends with `still running`. When the agent asks a person something (a "
    "permission), the result says so and gives the live view URL where it is answered. Every "
    "window where the session is open sees the turn live."
)
CANCEL = (
    "Cancels the session's running turn and returns its stop reason (`stop reason: cancelled`). "
    "With activityId (a turn's `activity:` line), only that turn: one still queued is withdrawn "
    "when you sent it."
)
STOP = (
    "Releases the session's agent process (STOPPED); nothing is lost, and session_resume "
    "brings it back. Returns the session's line."
)
INTERACTIONS = (
    "Lists what the session's agent is waiting for a person to answer: its open and claimed "
    "interactions (permission requests and questions), each on a line with its id, kind, "
    "state and revision, then the question (JSON) and, for a permission, its options "
    "(optionId: name)."
)
RESPOND = (
    "Answers one of the session's interactions (from interaction_list): optionId for a "
    "permission, action (accept, decline or cancel; content to accept) for a question. The "
    "answer is recorded before the agent hears it, and every window shows who answered. "
    "Refused with revision_conflict when it was answered, withdrawn or claimed meanwhile."
)
PRESENCE = (
    "Lists who has the session open now, on every broker node: a line per window with its "
    "participant id (a pseudonym, stable within this session), the name its client shared, "
    "its roles, whether it is online or away (idle), and when it was last active. Advisory: "
    "nothing is authorized by it."
)
DELETE = (
    "Deletes the session for everyone, as session/delete does; it then lists as DELETED. "
    "Deleting it again returns its line again."
)


def tool_set(line: LineRenderer) -> dict[str, SessionTool[Any]]:
    """Every session tool but ``session_list``, by name; ``line`` writes session lines."""

    async def create(
        tools: SessionTools, caller: Principal, inputs: CreateSessionTool, base: str
    ) -> str:
        view = await tools.create(caller.tenant, inputs, base, owner=caller)
        result = session_text(view, line)
        if inputs.prompt is None:
            return result
        session_id = view.row["sessionId"]
        turn = await tools.prompt(
            caller.tenant, session_id, inputs.prompt, inputs.wait, base, caller
        )
        return f"{result}\n{turn_text(turn)}"

    async def resume(
        tools: SessionTools, caller: Principal, inputs: SessionChange, base: str
    ) -> str:
        return session_text(await tools.resume(caller.tenant, inputs.id, base), line)

    async def prompt(
        tools: SessionTools, caller: Principal, inputs: SessionPrompt, base: str
    ) -> str:
        turn = await tools.prompt(caller.tenant, inputs.id, inputs.text, inputs.wait, base, caller)
        return turn_text(turn)

    async def cancel(
        tools: SessionTools, caller: Principal, inputs: SessionCancel, base: str
    ) -> str:
        # A queued prompt's author withdraws it with session.write; stopping a turn is control.
        needed = Permission.WRITE if inputs.activityId is not None else Permission.CONTROL
        await tools.require(caller, inputs.id, needed, "session_cancel")
        reason = await tools.cancel(caller.tenant, inputs.id, inputs.activityId, caller.subject)
        if reason is not None:
            return f"stop reason: {reason}"
        if inputs.activityId is None:
            return "no turn was running"
        return f"not cancelled: {inputs.activityId} is not running, nor queued by you"

    async def stop(tools: SessionTools, caller: Principal, inputs: SessionChange, base: str) -> str:
        return "\n".join(line([(await tools.stop(caller.tenant, inputs.id, base)).row]))

    async def delete(
        tools: SessionTools, caller: Principal, inputs: SessionChange, base: str
    ) -> str:
        return "\n".join(line([(await tools.delete(caller.tenant, inputs.id, base)).row]))

    async def interactions(
        tools: SessionTools, caller: Principal, inputs: SessionRef, base: str
    ) -> str:
        listed = await InteractionTools(tools).pending(caller, inputs.id)
        return "\n".join(interaction_lines(listed)) or "nothing is waiting for an answer"

    async def respond(
        tools: SessionTools, caller: Principal, inputs: InteractionRespond, base: str
    ) -> str:
        done = await InteractionTools(tools).respond(
            caller, inputs.id, inputs.interactionId, inputs.response(), inputs.expectedRevision
        )
        return "\n".join(interaction_lines([done]))

    async def present(tools: SessionTools, caller: Principal, inputs: SessionRef, base: str) -> str:
        present = await PresenceTools(tools).present(caller.tenant, inputs.id)
        return "\n".join(presence_lines(present))

    defined: list[SessionTool[Any]] = [
        SessionTool("session_create", "Create a session", CREATE, CreateSessionTool, create,
                    open_world=True),
        SessionTool("session_resume", "Resume a session", RESUME, SessionChange, resume,
                    idempotent=True, open_world=True, permission=Permission.READ),
        SessionTool("session_prompt", "Prompt a session", PROMPT, SessionPrompt, prompt,
                    open_world=True, repeatable=False, permission=Permission.WRITE),
        SessionTool("session_cancel", "Cancel a turn", CANCEL, SessionCancel, cancel,
                    idempotent=True),  # its permission depends on its inputs: see cancel
        SessionTool("session_stop", "Stop a session", STOP, SessionChange, stop, idempotent=True,
                    permission=Permission.ADMIN),
        SessionTool("session_delete", "Delete a session", DELETE, SessionChange, delete,
                    destructive=True, idempotent=True, permission=Permission.ADMIN),
        SessionTool("interaction_list", "List pending interactions", INTERACTIONS, SessionRef,
                    interactions, scope=Scope.READ, read_only=True, idempotent=True,
                    permission=Permission.READ),
        SessionTool("interaction_respond", "Answer an interaction", RESPOND,
                    InteractionRespond, respond, scope=API_SCOPE,
                    permission=Permission.APPROVE),
        SessionTool("session_presence", "Who is present", PRESENCE, SessionRef, present,
                    scope=Scope.READ, read_only=True, idempotent=True,
                    permission=Permission.PRESENCE),
    ]  # fmt: skip
    return {entry.name: entry for entry in defined}
