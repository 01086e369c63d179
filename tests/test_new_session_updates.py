"""Updates an agent sends right after answering ``session/new`` are not lost.

The demo agent announces its commands (``available_commands_update``) in a task that runs
once its ``session/new`` reply is written, so the broker reads the reply and, at once, the
update for the agent session id it has just learned. That update belongs in the session's
log and on the client that created the session, every time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from broker.serve import Broker
from broker.store.events import SessionSnapshot

from .support.client import LOADED_WAIT, REPLY_WAIT, RawClient, acp_client

SESSIONS = 8


async def test_updates_right_after_session_new_reach_the_log(broker: Broker, url: str) -> None:
    async with asyncio.timeout(REPLY_WAIT + LOADED_WAIT):  # an agent's start, then 8 sessions
        client = await acp_client(url)
        ids = [await client.new(cwd=f"/work/early{i}") for i in range(SESSIONS)]
        # A round trip through the same agent: its reply comes on the agent's stdout after
        # every announcement above, and the broker handles an agent's lines in order.
        await client.prompt(ids[-1], "/notool sync")

        logged = {}
        for session_id in ids:
            events = await broker.log.read("default", session_id)
            logged[session_id] = [
                e.body["update"]["sessionUpdate"] for e in events if e.body["type"] == "update"
            ]
        missing = [sid for sid in ids if "available_commands_update" not in logged[sid]]
        assert missing == [], f"{len(missing)} of {SESSIONS} sessions lost the update: {logged}"
        seen = [sid for sid in ids if "available_commands_update" in client.client.kinds(sid)]
        assert seen == ids
        await client.close()


async def test_a_new_session_whose_listing_meets_a_store_blip_is_answered_once(
    broker: Broker, url: str, tmp_path: Path
) -> None:
    """The store is out of reach for a moment after the agent host made the session (here
    the front's first index write of it fails as a lost connection does): the client is
    answered with that session, and its cwd lists that one alone. An error there had the
    client ask again, and left the first session orphaned in the list."""
    index = broker.methods.index
    project = index.project
    blips = [RedisConnectionError("connection lost (a blip)")]

    async def blipping(snapshot: SessionSnapshot, **how: Any) -> bool:
        if blips:
            raise blips.pop()
        return await project(snapshot, **how)

    index.project = blipping
    client = await RawClient.initialized(url)
    try:
        session_id = await client.new_session(str(tmp_path))
        assert not blips
        listed = await client.call("session/list", {"cwd": str(tmp_path)})
        assert [s["sessionId"] for s in listed["result"]["sessions"]] == [session_id]
    finally:
        await client.close()
