"""The broker's MCP server: the ``session_list`` tool, over stdio and streamable HTTP.

Built on the official ``mcp`` SDK's low-level :class:`mcp.server.Server`, so the tool's
input schema and annotations are exactly what :func:`session_list_tool` says and every
input is validated by the one list path (a bad input is a tool result marked
``isError``, never a protocol error). ``acp-broker mcp`` serves it over stdio
(:func:`serve_stdio`); a broker node serves it over streamable HTTP at ``/mcp`` on its
HTTP port (:mod:`.app`).
"""

from __future__ import annotations

import logging
from importlib import metadata

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from ...auth.credentials import Credentials
from ...config import Settings
from ...errors import ApiError
from ...store.client import connect
from ...store.query import SessionPage
from .sessions import TOOL_DESCRIPTION, SessionsService, input_properties, sessions_service

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
        input_schema={
            "type": "object",
            "properties": input_properties(),
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(
            title=TOOL_TITLE, read_only_hint=True, destructive_hint=False, open_world_hint=False
        ),
    )


def render_page(page: SessionPage) -> str:
    """One line per session, ``ID  STATUS  KIND  CREATED``, then ``after "…"`` if more remain."""
    width = max((len(str(row["sessionId"])) for row in page.rows), default=0)
    lines = [
        "  ".join(
            (
                str(row["sessionId"]).ljust(width),
                str(row.get("status") or "-").ljust(STATUS_WIDTH),
                str(row.get("kind") or "-").ljust(KIND_WIDTH),
                str(row.get("createdAt") or "-"),
            )
        )
        for row in page.rows
    ]
    if page.next_cursor is not None:
        lines.append(f'after "{page.next_cursor}"')
    return "\n".join(lines) if lines else NO_SESSIONS


def error_result(error: ApiError) -> types.CallToolResult:
    """A failure as the model sees it: ``<code>: <message>``, marked ``isError``."""
    text = f"{error.code}: {error.message}"
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def mcp_server(sessions: SessionsService) -> Server:
    """A low-level MCP server with the ``session_list`` tool, answered by ``sessions``."""

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        # With authentication on, what the broker offers is shown to callers with a good
        # credential only (initialize, which says nothing of the tools, stays open).
        try:
            await sessions.authenticate(_credentials(ctx))
        except ApiError as error:
            raise MCPError(UNAUTHORIZED, f"{error.code}: {error.message}") from None
        return types.ListToolsResult(tools=[session_list_tool()])

    async def call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
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
        instructions="Use session_list to find the sessions of this broker again.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


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
    """``acp-broker mcp``: the MCP server on stdin/stdout, reading the index in Redis."""
    store = connect(settings.redis_url, timeout=settings.redis_timeout)
    try:
        server = mcp_server(sessions_service(settings, store))
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await store.aclose()
