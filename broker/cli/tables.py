"""``acp-broker sessions``: a page of the session list as a table, read from the index."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..config import Settings
from ..errors import ApiError
from ..errors.store import query_refused
from ..front.http.tool_models import list_query
from ..store.client import connect
from ..store.cursors import CursorCodec
from ..store.query import BadCursor, SessionLister, SessionPage

HEADER = ("SESSION", "STATUS", "KIND", "CREATED", "AGENT", "TITLE", "CWD")


async def print_sessions(settings: Settings, inputs: Mapping[str, Any], *, cwd: str | None) -> int:
    """Print one page of the session list (the REST/MCP list path) as a table."""
    if settings.redis_url is None:
        print("acp-broker sessions: --redis-url is required (the embedded store lives in `serve`)")
        return 2
    redis = connect(settings.redis_url, timeout=settings.redis_timeout)
    try:
        query = dataclasses.replace(list_query(inputs), cwd=cwd)
        lister = SessionLister(redis, CursorCodec(settings.cursor_keys()))
        page = await lister.page(settings.tenant, query)
    except (ApiError, BadCursor) as refused:
        error = query_refused(refused) if isinstance(refused, BadCursor) else refused
        print(f"acp-broker sessions: {error.code}: {error.message}")
        return 2
    finally:
        await redis.aclose()
    print_table(page)
    return 0


def print_table(page: SessionPage) -> None:
    rows = [
        (
            r["sessionId"],
            r.get("status") or "-",
            r.get("kind") or "-",
            r.get("createdAt") or "-",
            r.get("agent") or "",
            r.get("title") or "",
            r.get("cwd") or "",
        )
        for r in page.rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(HEADER, *rows, strict=False)]
    for line in (HEADER, *rows):
        print("  ".join(str(v).ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    if page.next_cursor is not None:
        print(f"… more sessions: add --after {page.next_cursor}")
