"""What a session active on a connection costs its front: the bound's reason.

One broker in this process (embedded store). A first connection makes S sessions; a
second one, measured, resumes every one of them (so that it follows S sessions, none
replayed), then a third one, with the sessions' subscriptions already made, does the
same. Reported: the front's heap growth (``tracemalloc``, after a collection) per session
followed, for the first connection to follow them on the node (its own state, plus the
node's subscription to each session) and for another one (its own state only).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

from bench import common


async def _follow(url: str, sessions: list[str]) -> tuple[Any, int]:
    """A connection that resumes every session; it and the heap growth it cost."""
    from tests.support.client import RawClient

    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    client = await RawClient.initialized(url)
    for session_id in sessions:
        reply = await client.call(
            "session/resume", {"sessionId": session_id, "cwd": "/mem", "mcpServers": []}
        )
        assert "result" in reply, reply
    client.inbox.clear()
    gc.collect()
    return client, tracemalloc.get_traced_memory()[0] - before


async def measure(sessions: int) -> dict[str, Any]:
    from broker.serve import Broker
    from broker.store.client import connect
    from tests.conftest import make_settings

    store = connect(None)
    node = Broker(make_settings(max_sessions_per_connection=sessions + 1), redis=store)
    await node.start()
    url = f"ws://127.0.0.1:{node.port}/acp"
    try:
        from tests.support.client import RawClient

        maker = await RawClient.initialized(url)
        made = [await maker.new_session("/mem") for _ in range(sessions)]
        await maker.close()  # its subscriptions go: the next one makes them again
        tracemalloc.start()
        first, first_bytes = await _follow(url, made)
        other, other_bytes = await _follow(url, made)
        tracemalloc.stop()
        for client in (first, other):
            await client.close()
    finally:
        await node.stop()
        await store.aclose()
    return {
        "sessions": sessions,
        "first_follower_bytes_per_session": first_bytes / sessions,
        "other_follower_bytes_per_session": other_bytes / sessions,
    }


async def run(args: Any) -> None:
    counts = [20] if args.quick else [100, 500]
    cells = []
    for count in counts:
        cell = await measure(count)
        print(f"  {cell}", flush=True)
        cells.append(cell)
    text = common.table(
        "Front heap per session followed by a connection (tracemalloc)",
        ["sessions", "first follower B/session", "another follower B/session"],
        [
            [
                c["sessions"],
                c["first_follower_bytes_per_session"],
                c["other_follower_bytes_per_session"],
            ]
            for c in cells
        ],
    )
    common.report("session-memory", [text], {"runs": cells}, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("sessionmem", __doc__.splitlines()[0] if __doc__ else "")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
