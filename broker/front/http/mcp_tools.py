"""The session tools beside ``session_list``: what ``tools/list`` shows and how each answers.

Each tool is a :class:`SessionTool`: its MCP definition (input schema, title, truthful
annotations), the scope it needs and its handler over :class:`.session_tools.SessionTools`.
A result is text for a model: a session's line (``ID  STATUS  KIND  CREATED``, as
``session_list`` writes it), ``live view: URL``, and for a prompt the turn's reply
(:meth:`~.turns.TurnReport.text_lines`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from ...auth.principal import Scope
from ...errors import invalid_argument
from ...store.events import JsonObject
from .session_tools import (
    WAIT_DEFAULT,
    WAIT_MAX,
    SessionTools,
    SessionView,
    TurnView,
    session_id_of,
    text_of,
    wait_of,
)

Handler = Callable[[SessionTools, str, Mapping[str, Any], str], Awaitable[str]]
"""(tools, tenant, arguments, live view base) -> the result's text."""
LineRenderer = Callable[[list[JsonObject]], list[str]]


@dataclass(frozen=True, slots=True)
class SessionTool:
    """One tool: its definition, the scope it needs, its handler."""

    tool: types.Tool
    scope: Scope
    handler: Handler


_ID = {"type": "string", "description": "The session id (from session_list or session_create)."}
_WAIT = {
    "type": "number",
    "minimum": 0,
    "maximum": WAIT_MAX,
    "default": WAIT_DEFAULT,
    "description": f"Seconds to wait for the turn to end, 0 to {WAIT_MAX}. A turn that runs "
    "longer goes on: the result then says what came so far and `still running`.",
}


def _schema(properties: JsonObject, required: list[str]) -> JsonObject:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _tool(
    name: str,
    title: str,
    description: str,
    schema: JsonObject,
    *,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
) -> types.Tool:
    return types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema=schema,
        annotations=types.ToolAnnotations(
            title=title,
            read_only_hint=read_only,
            destructive_hint=destructive,
            idempotent_hint=idempotent,
            open_world_hint=open_world,
        ),
    )


def check_arguments(arguments: Mapping[str, Any], schema: JsonObject) -> None:
    """Unknown inputs and missing required ones are ``invalid_argument``."""
    allowed = schema["properties"]
    unknown = sorted(set(arguments) - set(allowed))
    if unknown:
        raise invalid_argument(f"unknown input {unknown[0]!r}; inputs: {', '.join(allowed)}")
    for name in schema["required"]:
        if arguments.get(name) is None:
            raise invalid_argument(f"{name} is required")


def session_text(view: SessionView, line: LineRenderer) -> str:
    """A session's line and its live view URL."""
    return "\n".join([*line([view.row]), f"live view: {view.live_view_url}"])


def turn_text(turn: TurnView) -> str:
    return "\n".join(turn.report.text_lines(turn.live_view_url))


_ONLY_ID = _schema({"id": _ID}, ["id"])

_CREATE_TOOL = _tool(
    "session_create",
    "Create a session",
    "Starts a new session on an agent, as an editor's session/new does, and "
    "optionally runs a first prompt in it. Returns the session's line (id, status, "
    "kind, creation time) and its live view URL, where a person can watch it; with "
    "a prompt, the agent's reply and the stop reason. The session is an ordinary "
    "one: editors and the web console can open it.",
    _schema(
        {
            "cwd": {
                "type": "string",
                "description": "The absolute path the agent works in.",
            },
            "agent": {
                "type": "string",
                "description": "A configured agent's name (default: the first).",
            },
            "title": {"type": "string", "description": "The session's title."},
            "userMetadata": {
                "type": "object",
                "description": "Your own data to keep with the session "
                "(session_list's q searches it).",
            },
            "prompt": {
                "type": "string",
                "description": "A first prompt to run at once (optional).",
            },
            "wait": _WAIT,
        },
        ["cwd"],
    ),
    open_world=True,
)

_RESUME_TOOL = _tool(
    "session_resume",
    "Resume a session",
    "Brings a STOPPED or ERROR session back onto an agent process (RUNNING), "
    "nothing lost; on a running session it does nothing. Returns the session's "
    "line and its live view URL.",
    _ONLY_ID,
    idempotent=True,
    open_world=True,
)

_PROMPT_TOOL = _tool(
    "session_prompt",
    "Prompt a session",
    "Runs one turn: sends text to the session's agent and returns its reply "
    "(the message text, each tool call on a line, then `stop reason: …`). A turn "
    "that outlives wait goes on; the result then ends with `still running`. When "
    "the agent asks a person something (a permission), the result says so and "
    "gives the live view URL where it is answered. Every window where the "
    "session is open sees the turn live.",
    _schema(
        {
            "id": _ID,
            "text": {"type": "string", "description": "The prompt."},
            "wait": _WAIT,
        },
        ["id", "text"],
    ),
    open_world=True,
)

_CANCEL_TOOL = _tool(
    "session_cancel",
    "Cancel a turn",
    "Cancels the session's running turn and returns its stop reason (`stop reason: cancelled`).",
    _ONLY_ID,
    idempotent=True,
)

_STOP_TOOL = _tool(
    "session_stop",
    "Stop a session",
    "Releases the session's agent process (STOPPED); nothing is lost, and "
    "session_resume brings it back. Returns the session's line.",
    _ONLY_ID,
    idempotent=True,
)

_DELETE_TOOL = _tool(
    "session_delete",
    "Delete a session",
    "Deletes the session for everyone, as session/delete does; it then lists as "
    "DELETED. Deleting it again returns its line again.",
    _ONLY_ID,
    destructive=True,
    idempotent=True,
)


def tool_set(line: LineRenderer) -> dict[str, SessionTool]:
    """Every session tool but ``session_list``, by name; ``line`` writes session lines."""

    async def create(tools: SessionTools, tenant: str, args: Mapping[str, Any], base: str) -> str:
        prompt = args.get("prompt")
        text = None if prompt is None else text_of(prompt, "prompt")
        wait = wait_of(args.get("wait"))
        view = await tools.create(tenant, args, base)
        result = session_text(view, line)
        if text is None:
            return result
        turn = await tools.prompt(tenant, view.row["sessionId"], text, wait, base)
        return f"{result}\n{turn_text(turn)}"

    async def resume(tools: SessionTools, tenant: str, args: Mapping[str, Any], base: str) -> str:
        return session_text(await tools.resume(tenant, session_id_of(args["id"]), base), line)

    async def prompt(tools: SessionTools, tenant: str, args: Mapping[str, Any], base: str) -> str:
        session_id = session_id_of(args["id"])
        text, wait = text_of(args["text"], "text"), wait_of(args.get("wait"))
        return turn_text(await tools.prompt(tenant, session_id, text, wait, base))

    async def cancel(tools: SessionTools, tenant: str, args: Mapping[str, Any], base: str) -> str:
        reason = await tools.cancel(tenant, session_id_of(args["id"]))
        return "no turn was running" if reason is None else f"stop reason: {reason}"

    async def stop(tools: SessionTools, tenant: str, args: Mapping[str, Any], base: str) -> str:
        view = await tools.stop(tenant, session_id_of(args["id"]), base)
        return "\n".join(line([view.row]))

    async def delete(tools: SessionTools, tenant: str, args: Mapping[str, Any], base: str) -> str:
        view = await tools.delete(tenant, session_id_of(args["id"]), base)
        return "\n".join(line([view.row]))

    defined = [
        SessionTool(_CREATE_TOOL, Scope.WRITE, create),
        SessionTool(_RESUME_TOOL, Scope.WRITE, resume),
        SessionTool(_PROMPT_TOOL, Scope.WRITE, prompt),
        SessionTool(_CANCEL_TOOL, Scope.WRITE, cancel),
        SessionTool(_STOP_TOOL, Scope.WRITE, stop),
        SessionTool(_DELETE_TOOL, Scope.WRITE, delete),
    ]
    return {entry.tool.name: entry for entry in defined}
