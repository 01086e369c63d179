"""Updates an agent sends right after answering ``session/new`` are not lost.

The demo agent announces its commands (``available_commands_update``) in a task that runs
once its ``session/new`` reply is written, so the broker reads the reply and, at once, the
update for the agent session id it has just learned. That update belongs in the session's
log and on the client that created the session, every time.
"""

from __future__ import annotations

import asyncio

from broker.serve import Broker

from .support.client import acp_client

SESSIONS = 8


async def test_updates_right_after_session_new_reach_the_log(broker: Broker, url: str) -> None:
    async with asyncio.timeout(30):
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
