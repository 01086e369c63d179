"""Fan-out: every connection where a session is active gets its events, in order, once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.front.fanout import FanoutHub
from broker.serve import Broker
from broker.store.client import connect
from broker.store.events import EventType, LogEvent
from broker.store.keys import SessionKeys
from broker.store.log import SessionLog, SessionMissing

from .support.client import RawClient, acp_client, text, wait_for
from .support.redis_server import restartable_redis


def _info_updates(client: RawClient, session_id: str) -> list[dict]:
    return [
        m["params"]["update"]
        for m in client.inbox
        if m.get("method") == "session/update"
        and m["params"]["sessionId"] == session_id
        and m["params"]["update"]["sessionUpdate"] == "session_info_update"
    ]


async def _read_info_updates(client: RawClient, session_id: str, count: int) -> list[dict]:
    """The session's info updates on ``client``, once it has received ``count`` of them."""
    await client.read_until(lambda: len(_info_updates(client, session_id)) >= count)
    return _info_updates(client, session_id)


async def _a_session_checked_often(broker: Broker, url: str) -> tuple[RawClient, str]:
    """A window with a new session, on a node whose hub checks positions every 0.1 s."""
    client = await RawClient.initialized(url)
    session_id = await client.new_session("/d")
    broker.hub.check_interval = 0.1
    return client, session_id


async def test_info_updates_reach_exactly_the_connections_where_the_session_is_active(
    url: str,
) -> None:
    a, b, c = [await RawClient.connect(url) for _ in range(3)]
    for client in (a, b, c):
        await client.initialize()
    session_id = await a.new_session("/tmp/fan")
    other = await c.call("session/new", {"cwd": "/tmp/other", "mcpServers": []})
    assert "result" in other
    resumed = await b.call("session/resume", {"sessionId": session_id, "cwd": "/tmp/fan"})
    assert resumed["result"] is not None

    # Agent-made: the first prompt names the session.
    reply = await a.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/notool name me")}
    )
    assert reply["result"]["stopReason"] == "end_turn"
    # Client-made: a title and a metadata patch, then a clear.
    await b.call(
        "session/set_title", {"sessionId": session_id, "title": "Renamed", "_meta": {"team": "x"}}
    )
    await a.call(
        "session/set_title", {"sessionId": session_id, "title": None, "_meta": {"team": None}}
    )

    expected: list[dict[str, Any]] = [
        {"sessionUpdate": "session_info_update", "title": "/notool name me"},
        {"sessionUpdate": "session_info_update", "title": "Renamed", "_meta": {"team": "x"}},
        {"sessionUpdate": "session_info_update", "title": None, "_meta": {"team": None}},
    ]
    for client in (a, b):
        got = await _read_info_updates(client, session_id, 3)
        assert [{k: v for k, v in u.items() if k != "_meta" or v} for u in got] == [
            {k: v for k, v in u.items() if k != "_meta" or v} for u in expected
        ]
    # The third connection never had the session active: it got nothing of it.
    await c.call("session/list", {})
    assert not [m for m in c.inbox if m.get("params", {}).get("sessionId") == session_id]
    listed = await c.call("session/list", {"cwd": "/tmp/fan"})
    [info] = listed["result"]["sessions"]
    assert "title" not in info and "team" not in info.get("_meta", {})
    for client in (a, b, c):
        await client.close()


async def test_set_title_reply_precedes_the_update_on_the_requesting_connection(url: str) -> None:
    a = await RawClient.initialized(url)
    session_id = await a.new_session("/tmp/t")
    await a.send(
        {
            "jsonrpc": "2.0",
            "id": "t1",
            "method": "session/set_title",
            "params": {"sessionId": session_id, "title": "First"},
        }
    )
    order: list[str] = []
    while len(order) < 2:
        message = await a.recv()
        if message.get("id") == "t1":
            order.append("reply")
        elif message.get("method") == "session/update" and (
            message["params"]["update"]["sessionUpdate"] == "session_info_update"
        ):
            order.append("update")
    assert order == ["reply", "update"]
    await a.close()


async def test_a_second_window_sees_the_prompt_typed_in_the_first_and_the_reply(url: str) -> None:
    typist = await acp_client(url)
    session_id = await typist.new()
    watcher = await acp_client(url)
    await watcher.conn.resume_session(session_id=session_id, cwd="/tmp/project")
    await typist.prompt(session_id, "/chunks 50")
    await wait_for(lambda: watcher.client.texts(session_id).count("chunk") >= 50, what="50 chunks")
    assert watcher.client.texts(session_id, "user_message_chunk") == "/chunks 50"
    # The typist does not get its own message echoed back.
    assert typist.client.texts(session_id, "user_message_chunk") == ""
    # Both saw the reply chunks in the same order, each once.
    assert watcher.client.texts(session_id) == typist.client.texts(session_id)
    expected = "".join(f"chunk {i}" for i in range(1, 51))
    assert typist.client.texts(session_id) == expected
    for client in (typist, watcher):
        await client.close()


async def test_every_update_carries_the_broker_position_and_resume_replays_after_it(
    url: str,
) -> None:
    first = await RawClient.initialized(url)
    session_id = await first.new_session("/tmp/p")
    await first.call("session/prompt", {"sessionId": session_id, "prompt": text("/chunks 10")})
    updates = [m for m in first.inbox if m.get("method") == "session/update"]
    positions = [m["params"]["_meta"]["acpBroker/position"] for m in updates]
    assert [p["seq"] for p in positions] == sorted({p["seq"] for p in positions})
    middle = positions[len(positions) // 2]
    await first.close()

    second = await RawClient.initialized(url)
    reply = await second.call(
        "session/resume",
        {"sessionId": session_id, "cwd": "/tmp/p", "_meta": {"acpBroker/replayAfter": middle}},
    )
    assert "result" in reply
    replayed = [m["params"]["_meta"]["acpBroker/position"]["seq"] for m in second.inbox]
    assert replayed == [p["seq"] for p in positions if p["seq"] > middle["seq"]]
    stale = await second.call(
        "session/resume",
        {
            "sessionId": session_id,
            "cwd": "/tmp/p",
            "_meta": {"acpBroker/replayAfter": {"seq": 1, "epoch": "not-this-log"}},
        },
    )
    assert stale["error"]["code"] == -32602
    ahead = await second.call(
        "session/resume",
        {
            "sessionId": session_id,
            "cwd": "/tmp/p",
            "_meta": {"acpBroker/replayAfter": {"seq": 10**9, "epoch": middle["epoch"]}},
        },
    )
    assert ahead["error"]["code"] == -32602
    await second.close()


async def test_a_deaf_subscription_is_noticed_and_nothing_is_lost(broker, url: str) -> None:
    """Pub/sub that silently stops delivering: the probe resubscribes, the log fills the gap."""
    client, session_id = await _a_session_checked_often(broker, url)
    hub = broker.hub
    # Make the subscription deaf: unsubscribe behind the hub's back.
    deaf = hub._live
    await deaf.sunsubscribe(*hub._feeds, hub.node_channel)
    reply = await client.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/chunks 5")}
    )
    assert reply["result"]["stopReason"] == "end_turn"
    assert client.chunks() == [f"chunk {i}" for i in range(1, 6)]
    # And live delivery works again afterwards, on a new subscription.
    await wait_for(
        lambda: hub._live is not deaf and hub._probes_unanswered == 0, what="probe answered"
    )
    assert all(not task.done() for task in hub.loops()) and hub.role_loops.running()
    await client.close()


async def test_a_session_whose_live_events_all_go_missing_is_served_from_its_log(
    broker, url: str
) -> None:
    """Pub/sub drops every event of a session (the subscription stays up): the position
    check, which compares the sessions that heard nothing with their snapshots, reads the
    lost events from the log, and the window gets each of them, in order."""
    watcher, session_id = await _a_session_checked_often(broker, url)
    hub = broker.hub
    handle = hub._on_message

    async def lossy(message: dict) -> None:
        if message.get("type") == "smessage" and '"seq":' in str(message.get("data")):
            return  # a live event, lost
        await handle(message)

    hub._on_message = lossy
    reply = await watcher.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/chunks 4")}
    )
    assert reply["result"]["stopReason"] == "end_turn"
    assert watcher.chunks() == [f"chunk {i}" for i in range(1, 5)]
    await watcher.close()


class _Window:
    """A subscriber that keeps what it is handed."""

    def __init__(self, name: str) -> None:
        self.id = name
        self.events: list[LogEvent] = []

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        self.events.append(event)


@contextlib.asynccontextmanager
async def _hub(redis_url: str) -> AsyncIterator[FanoutHub]:
    """A front's fan-out hub on its own connection to ``redis_url``."""
    store = connect(redis_url)
    hub = FanoutHub(store, SessionLog(store))
    await hub.start()
    try:
        yield hub
    finally:
        await hub.stop()
        await store.aclose()


def _suspended(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` has run up to an ``await`` that waits (its coroutine's ``cr_await``)."""
    return getattr(task.get_coro(), "cr_await", None) is not None


async def _created(redis_url: str, session_id: str) -> None:
    """A session's log made in tenant ``t`` (a hub can open its feed)."""
    store = connect(redis_url, timeout=2.0)
    try:
        await SessionLog(store).create("t", session_id, {"type": EventType.CREATED, "cwd": "/w"})
    finally:
        await store.aclose()


async def test_every_join_waiting_for_a_feed_whose_open_fails_gets_the_error(
    redis_url: str,
) -> None:
    """Windows joining one session at once wait for the first one's open of its feed: when
    that fails, each raises the error (its request is answered with it), none a bare
    cancellation that leaves its request unanswered."""
    async with _hub(redis_url) as hub:
        joins = [hub.join("t", "sess_gone", _Window(f"w{i}")) for i in range(3)]
        outcomes = await asyncio.gather(*joins, return_exceptions=True)
        assert [type(o) for o in outcomes] == [SessionMissing] * 3, outcomes
        assert hub.subscribers("sess_gone", "t") == []


async def test_a_join_whose_opener_was_cancelled_opens_the_feed_itself() -> None:
    """The first window's join is cancelled while it opens the feed (its client left; the
    server is stopped, so the open cannot end first): the window waiting for that open
    opens the feed again itself once the server is back, and joins."""
    with restartable_redis(aof=False) as server:
        await _created(server.url, "sess_1")
        async with _hub(server.url) as hub:
            channel = SessionKeys("t", "sess_1").channel
            server.pause()
            try:
                opener = asyncio.ensure_future(hub.join("t", "sess_1", _Window("first")))
                await wait_for(lambda: channel in hub._feeds, 5.0)
                waiting = asyncio.ensure_future(hub.join("t", "sess_1", _Window("waits")))
                # It waits for the opener's feed once its coroutine is suspended there.
                await wait_for(lambda: _suspended(waiting), 5.0)
                opener.cancel()
                await asyncio.wait([opener])
            finally:
                server.resume()
            assert await asyncio.wait_for(waiting, 10.0) == 1
            assert [w.id for w in hub.subscribers("sess_1", "t")] == ["waits"]


def _gapped(channel: str, seq: int, epoch: str) -> dict[str, Any]:
    """A live event whose seq skips one: the hub reads the log for the one it missed."""
    event = {"type": EventType.NOTICE, "text": f"e{seq}"}
    data = {"seq": seq, "epoch": epoch, "ts": 0, "event": event}
    return {"type": "smessage", "channel": channel, "data": json.dumps(data)}


async def test_catch_up_reads_failing_in_a_redis_outage_are_logged_in_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Events arrive with gaps while Redis is down: each catch-up read fails, and the log
    has one line for the first, not a traceback for each; then one line when it recovers."""
    with restartable_redis(aof=True) as server:
        await _created(server.url, "sess_1")
        async with _hub(server.url) as hub:
            window = _Window("w")
            assert await hub.join("t", "sess_1", window) == 1
            feed = hub._feeds[SessionKeys("t", "sess_1").channel]
            assert feed.last is not None and feed.epoch is not None
            channel, seq, epoch = feed.keys.channel, feed.last, feed.epoch
            caplog.set_level(logging.INFO, logger="broker.front.fanout")
            server.kill()
            for _ in range(5):
                seq += 2
                await hub._on_messages([_gapped(channel, seq, epoch)])
            server.start()
            seq += 2
            await wait_for(lambda: _caught_up(hub, window, _gapped(channel, seq, epoch)), 10.0)
        hub_lines = [r for r in caplog.records if r.name == "broker.front.fanout"]
        lines = [r for r in hub_lines if "catch-up" in r.getMessage() or r.exc_info]
        said = [r.getMessage().split(" after")[0].split(":")[0] for r in lines]
        assert said == ["catch-up read failed", "catch-up read recovered"], caplog.text


async def _caught_up(hub: FanoutHub, window: _Window, message: dict[str, Any]) -> bool:
    """Hand the hub a gapped event again; whether it reached the window this time (its
    catch-up read worked)."""
    await hub._on_messages([message])
    return bool(window.events) and window.events[-1].seq == json.loads(message["data"])["seq"]


async def test_an_opt_in_event_nobody_here_takes_is_handed_to_nobody(redis_url: str) -> None:
    """Windows that all said they drop presence changes are not handed one (a connect storm
    on one session logs one a window); once one takes them, every window is handed each
    (each drops what it did not ask for), and other events reach all of them throughout."""
    await _created(redis_url, "sess_p")
    store = connect(redis_url)
    log = SessionLog(store)
    presence = {"type": EventType.PRESENCE, "change": "joined"}
    try:
        async with _hub(redis_url) as hub:
            windows = [_Window("w1"), _Window("w2")]
            for window in windows:
                await hub.join("t", "sess_p", window)
                hub.deaf_to("t", "sess_p", window, frozenset({EventType.PRESENCE}))
            await log.append("t", "sess_p", presence)
            await log.append("t", "sess_p", {"type": EventType.NOTICE, "text": "one"})
            await wait_for(lambda: all(len(w.events) == 1 for w in windows), 10.0)
            assert [[e.type for e in w.events] for w in windows] == [[EventType.NOTICE]] * 2
            hub.deaf_to("t", "sess_p", windows[0], frozenset())
            await log.append("t", "sess_p", presence)
            await wait_for(lambda: all(len(w.events) == 2 for w in windows), 10.0)
            assert {w.events[-1].type for w in windows} == {EventType.PRESENCE}
    finally:
        await store.aclose()
