"""With ``--allow-evicting-store``, Redis may drop a session's log (the key the most events
live in) while its snapshot stays: loading the session then says its log was lost
(-32002), not that a position is no longer in it."""

from __future__ import annotations

from broker.serve import Broker
from broker.store.keys import SessionKeys

from .conftest import make_settings
from .support.client import RawClient, text
from .support.redis_server import redis_server


async def test_loading_a_session_whose_log_was_evicted_says_the_log_was_lost() -> None:
    with redis_server("--maxmemory-policy", "allkeys-lru") as url:
        node = Broker(make_settings(redis_url=url, allow_evicting_store=True))
        await node.start()
        try:
            client = await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp")
            session_id = await client.new_session("/evicted")
            prompt = {"sessionId": session_id, "prompt": text("/notool soon gone")}
            assert "result" in await client.call("session/prompt", prompt)
            await client.close()
            # What an evicting Redis does to the largest keys first.
            assert await node.redis.delete(SessionKeys(node.settings.tenant, session_id).log)
            other = await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp")
            params = {"sessionId": session_id, "cwd": "/evicted", "mcpServers": []}
            reply = await other.call("session/load", params)
            assert reply["error"]["code"] == -32002, reply
            assert reply["error"]["message"] == "this session's log was lost (the store dropped it)"
            assert reply["error"]["data"] == {"sessionId": session_id}
            [conn] = node.connections
            assert session_id not in conn.active
            await other.close()
        finally:
            await node.stop()
