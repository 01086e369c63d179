"""What a session active on a connection costs its front: the bound's reason.

One broker in this process (embedded store). A first connection makes S sessions and
closes; two more resume every one of them (each follows S sessions, none replayed). Each
is measured by what its close gives back to the heap (``tracemalloc``, after a
collection), per session: the one that closes last held the node's subscription to each
session as well; the other only its own state. (The client side is in the same process:
its socket's share, over S sessions, is in the figure too.)
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

from bench import common


async def _follow(url: str, sessions: list[str]) -> Any:
    """A connection that resumes every session (nothing replayed)."""
    from tests.support.client import RawClient

    client = await RawClient.initialized(url)
    for session_id in sessions:
        reply = await client.call(
            "session/resume", {"sessionId": session_id, "cwd": "/mem", "mcpServers": []}
        )
        assert "result" in reply, reply
    client.inbox.clear()
    return client


async def _heap_after_close(node: Any, client: Any, left: int) -> int:
    """The traced heap once ``client`` closed and the front let its connection go."""
    from tests.support.client import wait_for

    await client.close()
    await wait_for(lambda: len(node.connections) <= left, timeout=30)
    gc.collect()
    return int(tracemalloc.get_traced_memory()[0])


async def measure(sessions: int) -> dict[str, Any]:
    """What two connections following ``sessions`` sessions hold, each measured as the
    heap its close gives back: the other follower's (its own state), then the first's
    (its own state and the node's subscription to each session, which go with it)."""
    from broker.serve import Broker
    from broker.store.client import connect
    from tests.conftest import make_settings
    from tests.support.client import RawClient

    store = connect(None)
    node = Broker(make_settings(max_sessions_per_connection=sessions + 1), redis=store)
    await node.start()
    url = f"ws://127.0.0.1:{node.port}/acp"
    try:
        maker = await RawClient.initialized(url)
        made = [await maker.new_session("/mem") for _ in range(sessions)]
        await _heap_after_close(node, maker, 0)  # its subscriptions go with it
        tracemalloc.start()
        first = await _follow(url, made)
        other = await _follow(url, made)
        gc.collect()
        both = tracemalloc.get_traced_memory()[0]
        one = await _heap_after_close(node, other, 1)
        none = await _heap_after_close(node, first, 0)
        tracemalloc.stop()
    finally:
        await node.stop()
        await store.aclose()
    return {
        "sessions": sessions,
        "first_follower_bytes_per_session": (one - none) / sessions,
        "other_follower_bytes_per_session": (both - one) / sessions,
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
    common.report("sessionmem", [text], {"quick": args.quick, "runs": cells}, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("sessionmem", __doc__.splitlines()[0] if __doc__ else "")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
