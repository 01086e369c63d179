"""A failover that lost acknowledged events: no later event is skipped, none duplicated.

Real servers: a master, its replica, and a loopback proxy the broker reaches Redis through.
The replica stops replicating (``REPLICAOF NO ONE``) at a chosen moment; the broker appends
more events, which the master acknowledges and a watcher is sent; then the proxy switches
to the replica (a failover as the broker sees it: the events after the split are lost).
New events must reach the watcher, and a client resuming from the lost position, each
exactly once and in order: the log gives them seqs past every seq handed out before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from acp import text_block

from broker.protocol.render import POSITION_META, session_updates
from broker.protocol.v2 import REPLAY_POSITION
from broker.serve import Broker
from broker.store.client import connect
from broker.store.keys import SessionKeys
from broker.store.log import SessionLog

from .conftest import make_settings
from .support.client import RawClient, wait_for
from .support.redis_proxy import switching_proxy
from .support.redis_server import master_with_replica, port_of
from .support.wire import CheckedClient
from .test_bridge_e2e import _initialize, bridged

TENANT = "default"


@pytest.fixture
def master_and_replica() -> Iterator[tuple[str, str]]:
    with master_with_replica() as urls:
        yield urls


def _seq(update: dict[str, Any]) -> int:
    return int(update["_meta"][POSITION_META]["seq"])


async def _prompt(client: RawClient, session_id: str, words: str) -> None:
    """A prompt, asked again while the store is away (bounded): answered ``end_turn``."""
    deadline = time.monotonic() + 30
    while True:
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": words}]}
        reply = await client.call("session/prompt", params, timeout=30)
        if "result" in reply:
            assert reply["result"]["stopReason"] == "end_turn", reply
            return
        assert time.monotonic() < deadline, reply
        await asyncio.sleep(0.2)


def _snapshot_past(url: str, key: str, seq: int) -> bool:
    """Whether the snapshot at ``key`` holds a seq or a floor of at least ``seq``."""
    with redis.Redis.from_url(url) as r:
        stored, floor = r.hmget(key, ["seq", "floor"])
    return max(int(stored or 0), int(floor or 0)) >= seq


async def _wait_replicated(master: str, replica: str, key: str) -> None:
    with redis.Redis.from_url(master) as m, redis.Redis.from_url(replica) as r:
        deadline = time.monotonic() + 10
        while r.hget(key, "seq") != m.hget(key, "seq"):
            assert time.monotonic() < deadline, "the replica did not catch up"
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("host_remembers", [True, False], ids=["host-floor", "hub-floor"])
async def test_a_failover_that_lost_acknowledged_events_skips_and_repeats_nothing(
    master_and_replica: tuple[str, str], caplog: pytest.LogCaptureFixture, host_remembers: bool
) -> None:
    """``host-floor``: the agent host that appended the lost events appends the next ones.
    ``hub-floor``: it forgot them (as a host that took the session over never knew them),
    and the floor the front's hub left in the snapshot keeps the next seqs past them."""
    master, replica = master_and_replica
    caplog.set_level(logging.WARNING)
    async with switching_proxy(port_of(master)) as proxy:
        node = Broker(make_settings(redis_url=proxy.url, request_timeout=20))
        await node.start()
        url = f"ws://127.0.0.1:{node.port}/acp"
        prompter = await RawClient.initialized(url)
        watcher = await RawClient.initialized(url)
        try:
            session_id = await prompter.new_session("/rewind")
            keys = SessionKeys(TENANT, session_id)
            resumed = await watcher.call(
                "session/resume", {"sessionId": session_id, "cwd": "/rewind", "mcpServers": []}
            )
            assert "result" in resumed, resumed

            await _prompt(prompter, session_id, "/chunks 3 kept")
            await _wait_replicated(master, replica, keys.snapshot)
            with redis.Redis.from_url(replica) as r:
                r.replicaof("no", "one")  # what follows is acknowledged by the master only
                split = int(r.hget(keys.snapshot, "seq") or 0)

            await _prompt(prompter, session_id, "/chunks 3 lost")
            await watcher.read_until(
                lambda: (
                    sum("lost" in str(u) for u in watcher.updates(session_id)) > 0
                    and len(watcher.chunks(session_id)) >= 6
                ),
                timeout=20,
            )
            await asyncio.sleep(0)
            lost_at = _seq(watcher.updates(session_id)[-1])
            assert lost_at > split

            with redis.Redis.from_url(master) as m:
                acknowledged = int(m.hget(keys.snapshot, "seq") or 0)
            proxy.switch(port_of(replica))  # the failover: the events after ``split`` are gone
            before = len(watcher.updates(session_id))

            # A client resuming from a lost position before anything new was appended: a
            # clear error, not a hang and not a gap.
            early = await RawClient.initialized(url)
            try:
                epoch = _epoch(watcher, session_id)
                meta = {"acpBroker/replayAfter": {"seq": lost_at, "epoch": epoch}}
                deadline = time.monotonic() + 20
                while True:
                    reply = await early.call(
                        "session/resume",
                        {
                            "sessionId": session_id,
                            "cwd": "/rewind",
                            "mcpServers": [],
                            "_meta": meta,
                        },
                        timeout=20,
                    )
                    error = reply.get("error") or {}
                    if error.get("code") == -32602:
                        assert "ahead" in error["message"], error
                        break
                    assert time.monotonic() < deadline, reply
                    await asyncio.sleep(0.2)
            finally:
                await early.close()

            if not host_remembers:
                # The front's hub finds the log behind and leaves a floor, or the front's own
                # next append (a window's presence) went past the lost seqs with the floor
                # its hub gave it: either way the snapshot is past every acknowledged seq.
                await wait_for(
                    lambda: _snapshot_past(replica, keys.snapshot, acknowledged),
                    timeout=20,
                    what="the snapshot to be past every acknowledged seq",
                )
                assert node.worker is not None
                node.worker.host.log.appender.floors.forget(session_id)
                # With the floor left, a resume from the lost position is taken (nothing
                # to replay yet), and what comes next reaches it live.
                floored = await RawClient.initialized(url)
                reply = await floored.call(
                    "session/resume",
                    {"sessionId": session_id, "cwd": "/rewind", "mcpServers": [], "_meta": meta},
                )
                assert "result" in reply and floored.updates(session_id) == [], reply
            await _prompt(prompter, session_id, "/chunks 3 after")
            await watcher.read_until(lambda: len(watcher.chunks(session_id)) >= 9, timeout=30)

            # What the watcher got after the lost events is what the log holds after them,
            # every event once, in order.
            store = connect(replica)
            try:
                events = await SessionLog(store).read(TENANT, session_id, after=split)
            finally:
                await store.aclose()
            # No seq is given twice: the first new event comes after every one acknowledged.
            assert events and events[0].seq == acknowledged + 1
            expected = [
                (event.seq, u["params"]["update"])
                for event in events
                if event.type != "presence"  # sent to windows that follow presence only
                for u in session_updates(event, session_id)
            ]
            got = [(_seq(u), u["update"]) for u in watcher.updates(session_id)[before:]]
            assert got == expected
            if not host_remembers:
                await floored.read_until(lambda: len(floored.chunks(session_id)) >= 3)
                assert [(_seq(u), u["update"]) for u in floored.updates(session_id)] == expected
                await floored.close()

            # A client resuming from the lost position is sent exactly those events.
            late = await RawClient.initialized(url)
            try:
                reply = await late.call(
                    "session/resume",
                    {"sessionId": session_id, "cwd": "/rewind", "mcpServers": [], "_meta": meta},
                    timeout=20,
                )
                assert "result" in reply, reply
                replayed = [(_seq(u), u["update"]) for u in late.updates(session_id)]
                assert replayed == expected
            finally:
                await late.close()
            # A v2 client resuming from the event after the lost position: the same events.
            v2 = await CheckedClient.open(url, 2)
            try:
                replay_from = {"type": REPLAY_POSITION, "seq": lost_at + 1, "epoch": epoch}
                reply = await v2.call(
                    "session/resume",
                    {"sessionId": session_id, "cwd": "/rewind", "replayFrom": replay_from},
                )
                assert "result" in reply, reply
                seqs = [_seq(u) for u in v2.updates(session_id)]
                assert seqs == sorted(seqs) and set(seqs) <= {e.seq for e in events}
                first = next(e.seq for e in events if e.type != "presence")  # as above
                assert seqs[0] == first and seqs[-1] >= expected[-1][0]  # v2: the end too
            finally:
                await v2.close()
            rewinds = [r for r in caplog.records if "Redis lost acknowledged writes" in r.message]
            assert rewinds, "the rewind was not reported"
        finally:
            await prompter.close()
            await watcher.close()
            await node.stop()


def _epoch(client: RawClient, session_id: str) -> str:
    return str(client.updates(session_id)[-1]["_meta"][POSITION_META]["epoch"])


async def test_the_bridge_resumes_after_a_lost_position_and_the_editor_misses_nothing(
    master_and_replica: tuple[str, str], tmp_path: Path
) -> None:
    """The stdio bridge forwarded events the store then lost, and its WebSocket drops: its
    resume from the lost position is refused as ahead of the log, it resumes from the log's
    end, and the editor gets every later event once."""
    master, replica = master_and_replica
    async with (
        switching_proxy(port_of(master)) as redis_proxy,
        asyncio.timeout(90),
    ):
        node = Broker(make_settings(redis_url=redis_proxy.url, request_timeout=20))
        await node.start()
        try:
            async with (
                switching_proxy(node.port) as ws_proxy,
                bridged(f"ws://127.0.0.1:{ws_proxy.port}/acp", tmp_path) as (conn, editor, _),
            ):
                await _initialize(conn)
                session_id = (await conn.new_session(cwd="/rewind", mcp_servers=[])).session_id
                keys = SessionKeys(TENANT, session_id)
                one = "".join(f"chunk {i}" for i in range(1, 4))

                async def prompt(words: str, chunks: str) -> None:
                    reply = await conn.prompt(session_id=session_id, prompt=[text_block(words)])
                    assert reply.stop_reason == "end_turn"
                    await wait_for(lambda: editor.texts(session_id) == chunks, timeout=20)

                await prompt("/chunks 3 kept", one)
                await _wait_replicated(master, replica, keys.snapshot)
                with redis.Redis.from_url(replica) as r:
                    r.replicaof("no", "one")
                await prompt("/chunks 3 lost", one * 2)

                redis_proxy.switch(port_of(replica))  # the failover
                ws_proxy.switch(node.port)  # the bridge's connection drops: it resumes
                stderr = tmp_path / "bridge.stderr"
                await wait_for(
                    lambda: "its last events were lost" in stderr.read_text(),
                    timeout=30,
                    what="the bridge to resume from the log's end",
                )
                await prompt("/chunks 3 after", one * 3)
                # Nothing comes twice: a turn after it reaches the editor right behind it (a
                # stray event would come before the turn's, and the texts would never match).
                await prompt("/chunks 1 last", one * 3 + "chunk 1")
                assert "could not be resumed" not in stderr.read_text()
        finally:
            await node.stop()
