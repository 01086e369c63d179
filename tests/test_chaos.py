"""Kill -9 a front node, an agent host and a projector during 10,000 events over 100 sessions.

Afterwards every connection that reconnected has seen every event of its session exactly
once, in order, and the index equals a rebuild from the logs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker.protocol.render import session_updates
from broker.store.client import connect
from broker.store.index import SessionIndex
from broker.store.log import SessionLog
from broker.store.rebuild import rebuild_index

from .support.client import RawClient
from .support.projection import feeds_of, until_consumed
from .test_scale_out import cluster_of

SESSIONS = 100
CHUNKS = 100  # 100 sessions x 100 chunks = 10,000 agent events


class Watcher:
    """One client connection watching one session, reconnecting when its node dies."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.seen: list[dict[str, Any]] = []
        self.client: RawClient | None = None

    async def attach(self, url: str) -> None:
        self.client = await RawClient.connect(url)
        await self.client.initialize()
        params: dict[str, Any] = {"sessionId": self.session_id, "cwd": "/chaos"}
        if self.seen:
            last = self.seen[-1]["_meta"]["acpBroker/position"]
            params["_meta"] = {"acpBroker/replayAfter": last}
        else:
            params["_meta"] = {"acpBroker/replayAfter": {"seq": 0, "epoch": await self._epoch()}}
        reply = await self.client.call("session/resume", params, timeout=30)
        assert "result" in reply, reply
        self._collect()

    async def _epoch(self) -> str:
        redis = connect(self.redis_url)
        try:
            return (await SessionLog(redis).snapshot("default", self.session_id)).epoch
        finally:
            await redis.aclose()

    redis_url = ""

    def _collect(self) -> None:
        assert self.client is not None
        self.seen += self.client.updates(self.session_id)
        self.client.inbox.clear()

    async def pump(self, until: float) -> bool:
        """Read until ``until`` (loop time); False if the connection died."""
        assert self.client is not None
        loop = asyncio.get_running_loop()
        try:
            while loop.time() < until:
                self.client.inbox.append(await self.client.recv(max(0.01, until - loop.time())))
                self._collect()
        except TimeoutError:
            return True
        except Exception:
            self._collect()
            return False
        return True


async def test_killing_a_front_node_an_agent_host_and_a_projector_loses_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    # One driver connection starts all 100 prompts at once: past the default request rate
    # of a connection (which depends on how fast the 100 session/new went before).
    fast = {"ACP_BROKER_RATE_PER_CONNECTION": "1000"}
    async with cluster_of(
        redis_url, tmp_path, fronts=2, hosts=2, projectors=2, front_env=fast
    ) as deployment:
        nodes, hosts, projectors = deployment.nodes, deployment.hosts, deployment.projectors
        driver = await RawClient.initialized(nodes[1].url)
        ids = []
        for _ in range(SESSIONS):
            ids.append(await driver.new_session("/chaos"))
        Watcher.redis_url = redis_url
        watchers = [Watcher(sid) for sid in ids]
        for i, watcher in enumerate(watchers):
            await watcher.attach(nodes[i % 2].url)
        for sid in ids:  # every session streams at once
            await driver.send_prompt(sid, sid, f"/slow {CHUNKS}")
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(w.pump(loop.time() + 2.0) for w in watchers))
        # Chaos: one of each role dies without warning.
        await nodes[0].kill()
        await hosts[0].kill()
        await projectors[0].kill()
        alive = await asyncio.gather(*(w.pump(loop.time() + 0.5) for w in watchers))
        for i, (watcher, ok) in enumerate(zip(watchers, alive, strict=True)):
            if not ok or i % 2 == 0:  # its node died: reconnect to the other, resume after
                await watcher.attach(nodes[1].url)
        # Every prompt ends: those the killed host had begun with an error, via the takeover;
        # those it had acknowledged but not begun run again on the other host.
        deadline = loop.time() + 120
        pending = set(ids)
        ended: dict[str, dict[str, Any]] = {}
        while pending and loop.time() < deadline:
            message = await driver.recv(deadline - loop.time())
            if message.get("id") in pending and "method" not in message:
                pending.discard(message["id"])
                ended[message["id"]] = message
        assert not pending, f"{len(pending)} prompts never ended"
        finished = [m for m in ended.values() if "result" in m]
        cut = [m for m in ended.values() if m.get("error", {}).get("code") == -32603]
        assert len(finished) + len(cut) == SESSIONS, ended  # nothing refused, say
        # The surviving host's turns end normally; how many it held depends on how the
        # sessions were spread, which nothing here fixes (49 of 100 has been seen).
        assert finished
        await asyncio.gather(*(w.pump(loop.time() + 3.0) for w in watchers))

        redis = connect(redis_url)
        session_log = SessionLog(redis)
        total = 0
        for watcher in watchers:
            events = await session_log.read("default", watcher.session_id)
            expected = [
                m["params"]
                for e in events
                for m in session_updates(e, watcher.session_id)
                if e.type not in ("prompt", "presence")  # presence: to followers only
            ]
            got = [u for u in watcher.seen if u["update"]["sessionUpdate"] != "user_message_chunk"]
            assert got == expected, watcher.session_id
            total += sum(1 for e in events if e.type == "update")
        assert total >= SESSIONS * CHUNKS // 2
        index = SessionIndex(redis)
        sessions = [w.session_id for w in watchers]
        await until_consumed(redis, feeds_of("default", sessions))
        live = await index.dump("default")
        await rebuild_index(redis)
        assert await index.dump("default") == live
        await redis.aclose()
