"""The broker's MCP server: the ``session_list`` tool, over stdio and streamable HTTP.

Built on the official ``mcp`` SDK's low-level :class:`mcp.server.Server`, so the tool's
input schema (its input model's, :mod:`.tool_models`) and annotations are exactly what
:func:`session_list_tool` says and every input is validated by that model (a bad input
is a tool result marked ``isError``, never a protocol error). ``acp-broker mcp`` serves
it over stdio (:func:`serve_stdio`); a broker node serves it over streamable HTTP at
``/mcp`` on its HTTP port (:mod:`.app`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from ...auth.credentials import Credentials
from ...config import Settings
from ...errors import ApiError, ErrorCode
from ...store.client import connect
from ...store.events import JsonObject
from ...store.query import SessionPage
from ..operation_claims import ledger
from .mcp_tools import SessionTool, tool_set
from .session_tools import SessionTools, stdio_base
from .sessions import TOOL_DESCRIPTION, SessionsService, sessions_service
from .tool_inputs import input_schema
from .tool_models import CreateSession, PromptInput, SessionListInput
from .tool_operations import once

log = logging.getLogger(__name__)

TOOL_NAME = "session_list"
TOOL_TITLE = "List sessions"
STATUS_WIDTH = 7  # RUNNING, STOPPED, DELETED
KIND_WIDTH = 8  # combined
NO_SESSIONS = "(no sessions)"
UNAUTHORIZED = -32001
"""The JSON-RPC error of ``tools/list`` without a good credential (a server error code:
MCP has none of its own for this)."""


def session_list_tool() -> types.Tool:
    """The tool as ``tools/list`` shows it."""
    return types.Tool(
        name=TOOL_NAME,
        title=TOOL_TITLE,
        description=TOOL_DESCRIPTION,
        input_schema=input_schema(SessionListInput),
        annotations=types.ToolAnnotations(
            title=TOOL_TITLE, read_only_hint=True, destructive_hint=False, open_world_hint=False
        ),
    )


def session_lines(rows: list[JsonObject]) -> list[str]:
    """One line per session, ``ID  STATUS  KIND  CREATED``, the ids padded to one width."""
    width = max((len(str(row["sessionId"])) for row in rows), default=0)
    return [
        "  ".join(
            (
                str(row["sessionId"]).ljust(width),
                str(row.get("status") or "-").ljust(STATUS_WIDTH),
                str(row.get("kind") or "-").ljust(KIND_WIDTH),
                str(row.get("createdAt") or "-"),
            )
        )
        for row in rows
    ]


def render_page(page: SessionPage) -> str:
    """One line per session, ``ID  STATUS  KIND  CREATED``, then ``after "…"`` if more remain."""
    lines = session_lines(page.rows)
    if page.next_cursor is not None:
        lines.append(f'after "{page.next_cursor}"')
    return "\n".join(lines) if lines else NO_SESSIONS


def error_result(error: ApiError) -> types.CallToolResult:
    """A failure as the model sees it: ``<code>: <message>``, marked ``isError``."""
    text = f"{error.code}: {error.message}"
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def mcp_server(
    sessions: SessionsService,
    tools: SessionTools | None = None,
    base: Callable[[ServerRequestContext], str] | None = None,
) -> Server:
    """A low-level MCP server with the ``session_list`` tool, answered by ``sessions``, and
    the other session tools, answered by ``tools`` (``base``: the live view URL's base for
    a call)."""
    others = tool_set(session_lines) if tools is not None else {}

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        # With authentication on, what the broker offers is shown to callers with a good
        # credential only (initialize, which says nothing of the tools, stays open).
        try:
            await sessions.authenticate(_credentials(ctx))
        except ApiError as error:
            raise MCPError(UNAUTHORIZED, f"{error.code}: {error.message}") from None
        listed = [session_list_tool(), *(entry.tool for entry in others.values())]
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        entry = others.get(params.name)
        if entry is not None and tools is not None:
            return await _call_session_tool(tools, entry, ctx, params, base)
        if params.name != TOOL_NAME:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        try:
            page = await sessions.page(params.arguments or {}, _credentials(ctx))
        except ApiError as error:
            return error_result(error)
        text = render_page(page)
        return types.CallToolResult(content=[types.TextContent(text=text)])

    return Server(
        "acp-broker",
        version=_version(),
        title="ACP Broker",
        instructions="Use session_list to find the sessions of this broker again"
        + (
            "; session_create, session_prompt and the other session tools to start, drive "
            "and stop them (each gives a live view URL a person can open)."
            if others
            else "."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _call_session_tool(
    tools: SessionTools,
    entry: SessionTool[Any],
    ctx: ServerRequestContext,
    params: types.CallToolRequestParams,
    base: Callable[[ServerRequestContext], str] | None,
) -> types.CallToolResult:
    """One session tool's call: authorized for its scope, inputs checked, run (a mutation
    once per ``operationId``: :mod:`.tool_operations`)."""
    arguments = params.arguments or {}
    try:
        caller = await tools.caller(_credentials(ctx), entry.scope)
        inputs = entry.inputs.parse(arguments)
        where = base(ctx) if base is not None else stdio_base(tools.settings)

        async def call() -> str:
            return await _bounded(tools.guarded(entry.run(tools, caller, inputs, where)), bound)

        # A tool's call is answered within the request deadline, and a prompt's wait past it
        # (a turn that outlives its wait goes on): an agent host that took a command and went
        # quiet must not hold an MCP client forever.
        bound = tools.settings.request_timeout + _turn_wait(inputs)

        if not entry.mutation:
            text, failed = await call(), False
        else:
            text, failed = await tools.guarded(
                once(
                    ledger(tools.redis, tools.settings),
                    caller,
                    entry.name,
                    arguments,
                    call,
                    repeatable=entry.repeatable,
                    wait=tools.settings.request_timeout,
                )
            )
    except ApiError as error:
        return error_result(error)
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=failed)


def _turn_wait(inputs: object) -> float:
    """How long a call waits for a prompt's turn, beyond the request deadline (0: none)."""
    if isinstance(inputs, PromptInput) or (isinstance(inputs, CreateSession) and inputs.prompt):
        return inputs.wait
    return 0.0


async def _bounded(work: Awaitable[str], seconds: float) -> str:
    """``await work``, or the tools' ``unavailable`` error after ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise ApiError(
            ErrorCode.UNAVAILABLE, f"not answered within {seconds:g} s; try again shortly"
        ) from None


def http_base(ctx: ServerRequestContext) -> str:
    """The address an MCP request over HTTP came to (scheme, host and port)."""
    request = ctx.request
    url = getattr(request, "base_url", None)
    return str(url).rstrip("/") if url is not None else ""


def _credentials(ctx: ServerRequestContext) -> Credentials:
    """The caller's credentials: the HTTP request's Authorization header, or none on stdio."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return Credentials("mcp-stdio")
    return Credentials("mcp-http", headers.get("authorization"))


def _version() -> str:
    try:
        return metadata.version("acp-broker")
    except metadata.PackageNotFoundError:
        return "0"


async def serve_stdio(settings: Settings) -> None:
    """``acp-broker mcp``: the MCP server on stdin/stdout, on the broker's Redis: the index
    for ``session_list``, the agent hosts for the other tools (:mod:`.stdio_front`)."""
    from .stdio_front import stdio_tools  # the front's parts, only where they run

    store = connect(settings.redis_url, timeout=settings.redis_timeout)
    try:
        async with stdio_tools(settings, store) as tools:
            server = mcp_server(sessions_service(settings, store), tools)
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await store.aclose()
