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

from ...auth.principal import Scope
from ...store.events import JsonObject
from ..approval import API_SCOPE
from .interaction_tools import InteractionTools
from .presence_tools import PresenceTools, presence_lines
from .session_tools import SessionTools, SessionView, TurnView
from .tool_inputs import ToolInput, input_schema
from .tool_models import CreateSession, InteractionRespond, SessionPrompt, SessionRef

InputT = TypeVar("InputT", bound=ToolInput)
LineRenderer = Callable[[list[JsonObject]], list[str]]


@dataclass(frozen=True, slots=True)
class SessionTool(Generic[InputT]):
    """One tool: its definition, its input model, its handler ``(tools, tenant, inputs,
    live view base) -> the result's text`` and the scope a caller needs."""

    name: str
    title: str
    description: str
    inputs: type[InputT]
    handler: Callable[[SessionTools, str, InputT, str], Awaitable[str]]
    scope: Scope = Scope.WRITE
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False

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

    async def run(self, tools: SessionTools, tenant: str, arguments: JsonObject, base: str) -> str:
        """The call: its inputs checked (``invalid_argument``), then handled."""
        return await self.handler(tools, tenant, self.inputs.parse(arguments), base)


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
    "Cancels the session's running turn and returns its stop reason (`stop reason: cancelled`)."
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

    async def create(tools: SessionTools, tenant: str, inputs: CreateSession, base: str) -> str:
        view = await tools.create(tenant, inputs, base)
        result = session_text(view, line)
        if inputs.prompt is None:
            return result
        session_id = view.row["sessionId"]
        turn = await tools.prompt(tenant, session_id, inputs.prompt, inputs.wait, base)
        return f"{result}\n{turn_text(turn)}"

    async def resume(tools: SessionTools, tenant: str, inputs: SessionRef, base: str) -> str:
        return session_text(await tools.resume(tenant, inputs.id, base), line)

    async def prompt(tools: SessionTools, tenant: str, inputs: SessionPrompt, base: str) -> str:
        return turn_text(await tools.prompt(tenant, inputs.id, inputs.text, inputs.wait, base))

    async def cancel(tools: SessionTools, tenant: str, inputs: SessionRef, base: str) -> str:
        reason = await tools.cancel(tenant, inputs.id)
        return "no turn was running" if reason is None else f"stop reason: {reason}"

    async def stop(tools: SessionTools, tenant: str, inputs: SessionRef, base: str) -> str:
        return "\n".join(line([(await tools.stop(tenant, inputs.id, base)).row]))

    async def delete(tools: SessionTools, tenant: str, inputs: SessionRef, base: str) -> str:
        return "\n".join(line([(await tools.delete(tenant, inputs.id, base)).row]))

    async def interactions(tools: SessionTools, tenant: str, inputs: SessionRef, base: str) -> str:
        listed = await InteractionTools(tools).pending(tenant, inputs.id)
        return "\n".join(interaction_lines(listed)) or "nothing is waiting for an answer"

    async def respond(
        tools: SessionTools, tenant: str, inputs: InteractionRespond, base: str
    ) -> str:
        done = await InteractionTools(tools).respond(
            tenant, inputs.id, inputs.interactionId, inputs.response(), inputs.expectedRevision
        )
        return "\n".join(interaction_lines([done]))

    async def present(tools: SessionTools, tenant: str, inputs: SessionRef, base: str) -> str:
        return "\n".join(presence_lines(await PresenceTools(tools).present(tenant, inputs.id)))

    defined: list[SessionTool[Any]] = [
        SessionTool("session_create", "Create a session", CREATE, CreateSession, create,
                    open_world=True),
        SessionTool("session_resume", "Resume a session", RESUME, SessionRef, resume,
                    idempotent=True, open_world=True),
        SessionTool("session_prompt", "Prompt a session", PROMPT, SessionPrompt, prompt,
                    open_world=True),
        SessionTool("session_cancel", "Cancel a turn", CANCEL, SessionRef, cancel,
                    idempotent=True),
        SessionTool("session_stop", "Stop a session", STOP, SessionRef, stop, idempotent=True),
        SessionTool("session_delete", "Delete a session", DELETE, SessionRef, delete,
                    destructive=True, idempotent=True),
        SessionTool("interaction_list", "List pending interactions", INTERACTIONS, SessionRef,
                    interactions, scope=Scope.READ, read_only=True, idempotent=True),
        SessionTool("interaction_respond", "Answer an interaction", RESPOND,
                    InteractionRespond, respond, scope=API_SCOPE),
        SessionTool("session_presence", "Who is present", PRESENCE, SessionRef, present,
                    scope=Scope.READ, read_only=True, idempotent=True),
    ]  # fmt: skip
    return {entry.name: entry for entry in defined}
