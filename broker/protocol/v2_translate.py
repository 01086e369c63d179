"""ACP v1 shapes (what the agents behind the broker speak) as ACP v2 shapes.

Pure functions over JSON objects. Agents stay v1; a v2 client sees their
updates, requests and replies translated here. Identity that v2 requires and
v1 lacks (``messageId``, ``planId``) is supplied by the caller, who derives it
from the session's log (see :mod:`.v2_render`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from .jsonrpc import JsonObject

MESSAGE_CHUNKS = {
    "user_message_chunk": "echo",
    "agent_message_chunk": "agent",
    "agent_thought_chunk": "thought",
}
"""v1 chunk variants (kept in v2, where ``messageId`` is required) and the role of their id."""


MessageIdFor = Callable[[str, str | None], str]
"""``(role, agent's own messageId or None) -> messageId`` for the update being translated."""


def update(v1: JsonObject, message_id: MessageIdFor, plan_id: str) -> JsonObject | None:
    """A v1 ``session/update`` payload as v2, or None when v2 has no such update."""
    kind = v1.get("sessionUpdate")
    if not isinstance(kind, str):
        return None
    if kind in MESSAGE_CHUNKS:
        own = v1.get("messageId")
        role = MESSAGE_CHUNKS[kind]
        return {**v1, "messageId": message_id(role, own if isinstance(own, str) else None)}
    translate = _UPDATES.get(kind)
    if translate is not None:
        return translate(v1, plan_id)
    if kind in _UNCHANGED or kind.startswith("_"):
        return dict(v1)
    return None  # v1-only (current_mode_update) or unknown: never leak it as a v2 variant


def _tool_call(v1: JsonObject, _plan_id: str) -> JsonObject:
    """``tool_call`` and ``tool_call_update`` both become the v2 upsert ``tool_call_update``."""
    return {**tool_call_fields(v1), "sessionUpdate": "tool_call_update"}


def _plan(v1: JsonObject, plan_id: str) -> JsonObject:
    """v1 has one plan per session, replaced whole each time: one v2 plan id."""
    out: JsonObject = {
        "sessionUpdate": "plan_update",
        "plan": {"type": "items", "planId": plan_id, "entries": v1.get("entries") or []},
    }
    if v1.get("_meta") is not None:
        out["_meta"] = v1["_meta"]
    return out


def _commands(v1: JsonObject, _plan_id: str) -> JsonObject:
    commands = v1.get("availableCommands")
    if not isinstance(commands, list):
        return dict(v1)
    return {**v1, "availableCommands": [_command(c) for c in commands]}


def _command(command: Any) -> Any:
    """A v1 command gets the v2 ``type: "command"`` discriminator, and its untagged ``input``
    the v2 ``type: "text"`` one."""
    if not isinstance(command, dict):
        return command
    out = command if "type" in command else {"type": "command", **command}
    given = command.get("input")
    if isinstance(given, dict) and "type" not in given:
        out = {**out, "input": {"type": "text", **given}}
    return out


def _config_update(v1: JsonObject, _plan_id: str) -> JsonObject:
    return {**v1, "configOptions": config_options(v1.get("configOptions"))}


_UPDATES: dict[str, Callable[[JsonObject, str], JsonObject]] = {
    "tool_call": _tool_call,
    "tool_call_update": _tool_call,
    "plan": _plan,
    "available_commands_update": _commands,
    "config_option_update": _config_update,
}
_UNCHANGED = frozenset({"session_info_update", "usage_update", "notice"})


# -- tool call content ----------------------------------------------------------------------


def tool_call_fields(v1: JsonObject) -> JsonObject:
    """A v1 tool call (or update) with its content items in their v2 shapes."""
    out = dict(v1)
    if isinstance(out.get("content"), list):
        out["content"] = [tool_call_content(item) for item in out["content"]]
    return out


def tool_call_content(item: Any) -> Any:
    """One v1 ``ToolCallContent``: v1 diffs (path, oldText, newText) become v2 structured diffs."""
    if isinstance(item, dict) and item.get("type") == "diff" and "changes" not in item:
        return diff(item)
    return item


def diff(v1: JsonObject) -> JsonObject:
    """A v1 diff as v2 ``changes`` plus a ``git_patch`` rendering of the same change."""
    path = str(v1.get("path", ""))
    old, new = v1.get("oldText"), str(v1.get("newText", ""))
    change: JsonObject = {
        "operation": "add" if old is None else "modify",
        "path": path,
        "fileType": "text",
    }
    out: JsonObject = {
        "type": "diff",
        "changes": [change],
        "patch": {"format": "git_patch", "text": git_patch(path, old, new)},
    }
    if v1.get("_meta") is not None:
        out["_meta"] = v1["_meta"]
    return out


def git_patch(path: str, old: str | None, new: str) -> str:
    """One ``diff --git`` section (absolute paths, no commit metadata) from old to new text."""
    header = [f"diff --git {path} {path}\n"]
    if old is None:
        header.append("new file mode 100644\n")
    hunks = difflib.unified_diff(
        _lines(old or ""),
        _lines(new),
        fromfile="/dev/null" if old is None else path,
        tofile=path,
    )
    return "".join(header) + "".join(_terminated(hunks))


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _terminated(lines: Any) -> list[str]:
    """Patch lines, each ending in a newline; a missing final newline is marked as git does."""
    out: list[str] = []
    for line in lines:
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return out


# -- session config options -----------------------------------------------------------------


def config_options(v1: Any) -> list[Any]:
    """v1 config options (``id``, groups with ``group``) as v2 (``configId``, ``groupId``)."""
    if not isinstance(v1, list):
        return []
    return [_config_option(option) for option in v1]


def _config_option(option: Any) -> Any:
    if not isinstance(option, dict):
        return option
    out = _renamed(option, "id", "configId")
    if isinstance(out.get("options"), list):
        out["options"] = [_renamed(o, "group", "groupId") for o in out["options"]]
    return out


def _renamed(value: Any, old: str, new: str) -> Any:
    if not isinstance(value, dict) or old not in value or new in value:
        return value
    out = {k: v for k, v in value.items() if k != old}
    out[new] = value[old]
    return out


# -- requests to the client, replies, and what goes to the agent -----------------------------


def permission_request(v1: JsonObject) -> JsonObject:
    """v1 ``session/request_permission`` params as v2: required ``title``, a tool-call subject."""
    out = {k: v for k, v in v1.items() if k != "toolCall"}
    tool_call = v1.get("toolCall")
    title = tool_call.get("title") if isinstance(tool_call, dict) else None
    out["title"] = title if isinstance(title, str) and title else "Permission requested"
    if isinstance(tool_call, dict):
        out["subject"] = {"type": "tool_call", "toolCall": tool_call_fields(tool_call)}
    return out


def session_result(v1: JsonObject, *, keep: tuple[str, ...]) -> JsonObject:
    """An agent's v1 session reply reduced to the v2 fields ``keep`` (``modes`` are gone)."""
    out = {k: v for k, v in v1.items() if k in (*keep, "configOptions", "_meta")}
    if "configOptions" in out:
        out["configOptions"] = config_options(out["configOptions"])
    return out


def agent_mcp_servers(v2: Any) -> Any:
    """v2 MCP server configs as v1 agents take them (stdio untagged, empty lists required)."""
    if not isinstance(v2, list):
        return v2
    return [_agent_mcp_server(server) for server in v2]


def _agent_mcp_server(server: Any) -> Any:
    if not isinstance(server, dict):
        return server
    kind = server.get("type")
    if kind == "stdio":
        out = {k: v for k, v in server.items() if k != "type"}
        return {"args": [], "env": [], **out}
    if kind == "http":
        return {"headers": [], **server}
    return server
