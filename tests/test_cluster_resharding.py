"""A Redis Cluster resharded and failing over under traffic: nothing lost, duplicated or hung,
no error to a client, no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

from broker.serve import Broker
from broker.store.keys import SessionKeys, TenantKeys, key_slot

from .conftest import make_settings
from .support.client import RawClient, text, wait_for

CHUNKS = 40


class Watcher:
    """A client that resumed every session and reads everything it is sent, in a task."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            self.client.inbox.append(await self.client.recv(120))

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.client.close()


async def _prompt_until(
    actor: RawClient, session_id: str, done: asyncio.Event, replies: list[dict[str, Any]]
) -> None:
    """Prompts one after another until ``done`` is set, then one more."""
    while True:
        last = done.is_set()
        reply = await actor.call(
            "session/prompt",
            {"sessionId": session_id, "prompt": text(f"/chunks {CHUNKS}")},
            timeout=60,
        )
        replies.append(reply)
        if last or "error" in reply:
            return


def _assert_each_event_once_in_order(client: RawClient, session_id: str, prompts: int) -> None:
    seqs = [u["_meta"]["acpBroker/position"]["seq"] for u in client.updates(session_id)]
    assert seqs == sorted(set(seqs)), seqs  # each once, in order (not every event is an update)
    expected = [f"chunk {i}" for i in range(1, CHUNKS + 1)] * prompts
    assert client.chunks(session_id) == expected


def _loop_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What no fault may produce: a traceback logged, a task's error nobody retrieved, a
    session failed, a command that failed on a client's behalf, an internal error."""
    bad = ("never retrieved", "AttributeError", "failed: agent updates", "command ", "internal")
    return [
        r.getMessage()
        for r in caplog.records
        if r.exc_info or any(word in r.getMessage() for word in bad)
    ]


async def test_resharding_the_slots_of_active_sessions_under_traffic(
    redis_cluster_info: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    node = Broker(make_settings(redis_url=redis_cluster_info.url))
    await node.start()
    url = f"ws://127.0.0.1:{node.port}/acp"
    actors = [await RawClient.initialized(url) for _ in range(6)]
    watchers: list[Watcher] = []
    try:
        ids = [await actor.new_session("/r") for actor in actors]
        for _ in range(2):
            client = await RawClient.initialized(url)
            for sid in ids:
                reply = await client.call("session/resume", {"sessionId": sid, "cwd": "/r"})
                assert "result" in reply, reply
            watchers.append(Watcher(client))
        slots = sorted({key_slot(SessionKeys("default", s).log) for s in ids})
        slots.append(key_slot(TenantKeys("default").rows))
        masters = redis_cluster_info.masters()
        done = asyncio.Event()
        replies: list[list[dict[str, Any]]] = [[] for _ in ids]
        traffic = [
            asyncio.create_task(_prompt_until(actor, sid, done, mine))
            for actor, sid, mine in zip(actors, ids, replies, strict=True)
        ]
        for slot in slots:  # each to the next master: every active session's keys move
            owner = redis_cluster_info.master_of_slot(slot)
            target = masters[(masters.index(owner) + 1) % len(masters)]
            await asyncio.to_thread(redis_cluster_info.migrate_slot, slot, target)
        done.set()
        await asyncio.wait_for(asyncio.gather(*traffic), 120)
        failed = [r for mine in replies for r in mine if "result" not in r]
        assert failed == []
        assert {r["result"]["stopReason"] for mine in replies for r in mine} == {"end_turn"}
        after = await actors[0].new_session("/r/after")
        assert after
        listed = (await actors[0].call("session/list", {}))["result"]["sessions"]
        assert set(ids) | {after} <= {s["sessionId"] for s in listed}
        for sid, mine in zip(ids, replies, strict=True):
            prompts = len(mine)
            for watcher in watchers:
                await wait_for(
                    lambda w=watcher, s=sid, n=prompts: len(w.client.chunks(s)) >= n * CHUNKS,
                    60,
                    f"the watcher's chunks of {sid}",
                )
                _assert_each_event_once_in_order(watcher.client, sid, prompts)
        assert _loop_failures(caplog) == []
    finally:
        for watcher in watchers:
            await watcher.close()
        for actor in actors:
            await actor.close()
        await node.stop()
