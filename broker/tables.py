"""``acp-broker sessions``: the newest sessions as a table, read from the index."""

from __future__ import annotations

from .config import Settings
from .store.client import connect
from .store.index import ACP_LISTING, SessionIndex, cwd_listing


async def print_sessions(settings: Settings, *, limit: int, cwd: str | None) -> int:
    if settings.redis_url is None:
        print("acp-broker sessions: --redis-url is required (the embedded store lives in `serve`)")
        return 2
    redis = connect(settings.redis_url)
    try:
        listing = cwd_listing(cwd) if cwd else ACP_LISTING
        page = await SessionIndex(redis).page(settings.tenant, listing, None, limit)
    finally:
        await redis.aclose()
    rows = [
        (
            r["sessionId"],
            r["status"],
            r.get("agent", ""),
            r["updatedAt"],
            r.get("title") or "",
            r["cwd"],
        )
        for r in page.rows
    ]
    header = ("SESSION", "STATUS", "AGENT", "UPDATED", "TITLE", "CWD")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for line in (header, *rows):
        print("  ".join(str(v).ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    if page.has_more:
        print(f"… more sessions; use --limit to see more than {limit}")
    return 0
