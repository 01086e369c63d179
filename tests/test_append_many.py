"""``SessionLog.append_many``: several appends in one round trip, each exactly an ``append``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from broker.store.client import connect
from broker.store.events import fold
from broker.store.keys import session_keys
from broker.store.log import (
    Fenced,
    Position,
    SessionExists,
    SessionFull,
    SessionLog,
    SessionMissing,
    call_ids,
)
from broker.store.retry import STORE_AWAY

from .support.redis_server import restartable_redis


@pytest.fixture(params=["redis", "embedded", "cluster", "sentinel"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """On a cluster a batch is one call per partition: run everything there too."""
    return str(request.param)


def _chunk(text: str) -> dict[str, Any]:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    return {"type": "update", "update": update}


async def test_append_many_is_appends_in_order(store: Any) -> None:
    log = SessionLog(store)
    created = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}
    await log.create("t", "s1", created)
    await log.create("t", "s2", created)
    got = await log.append_many(
        [
            ("t", "s1", _chunk("a"), ""),
            ("t", "s2", _chunk("b"), ""),
            ("t", "missing", _chunk("c"), ""),
            (
                "t",
                "s1",
                {
                    "type": "update",
                    "update": {"sessionUpdate": "session_info_update", "title": "T"},
                },
                "",
            ),
        ]
    )
    assert [type(p) for p in got] == [Position, Position, SessionMissing, Position]
    assert [p.seq for p in got if isinstance(p, Position)] == [2, 2, 3]
    events = await log.read("t", "s1")
    assert [e.seq for e in events] == [1, 2, 3]
    assert events[1].body == _chunk("a")
    snapshot = await log.snapshot("t", "s1")
    folded = fold("t", "s1", events)
    assert folded is not None and folded.title == snapshot.title == "T"
    assert folded.seq == snapshot.seq == 3


async def test_append_many_checks_the_fence(store: Any) -> None:
    log = SessionLog(store)
    await log.create("t", "s", {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"})
    await log.set_fence("t", "s", "f2")
    got = await log.append_many([("t", "s", _chunk("x"), "f1")])
    assert isinstance(got[0], Fenced)
    assert [e.seq for e in await log.read("t", "s")] == [1]


async def test_an_append_made_again_after_an_unknown_outcome_lands_once(store: Any) -> None:
    """A client that lost the reply (a cut connection, a failover) sends the same call again:
    the log gets the event once; a call long past is a new one."""
    log = SessionLog(store)
    created = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}
    await log.create("t", "s", created)
    with pytest.raises(SessionExists):  # a fresh call: the session exists
        await log.create("t", "s", created)
    calls = call_ids(40)
    items = [("t", "s", _chunk(str(i)), "") for i in range(40)]
    once = await log.append_many(items, calls)
    assert [p.seq for p in once if isinstance(p, Position)] == list(range(2, 42))
    # The last 16 calls of the session are known: made again, they append nothing and
    # return the session's position.
    again = await log.append_many(items[24:], calls[24:])
    assert again == [once[-1]] * 16
    assert await log.append("t", "s", _chunk("39"), call=calls[-1]) == once[-1]
    assert [e.seq for e in await log.read("t", "s")] == list(range(1, 42))
    # A call long past is taken for a new one.
    older = await log.append("t", "s", _chunk("0"), call=calls[0])
    assert older.seq == 42 and (await log.snapshot("t", "s")).seq == 42


async def test_a_batch_over_many_sessions_lands_each_in_order(store: Any) -> None:
    """Events of 12 sessions interleaved (on a cluster: spread over its partitions)."""
    log = SessionLog(store)
    created = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}
    sessions = [f"s{k}" for k in range(12)]
    for session_id in sessions:
        await log.create("t", session_id, created)
    items = [("t", s, _chunk(f"{s}-{n}"), "") for n in range(5) for s in sessions]
    got = await log.append_many(items)
    assert [p.seq for p in got if isinstance(p, Position)] == [
        n + 2 for n in range(5) for _ in sessions
    ]
    for session_id in sessions:
        bodies = [e.body for e in await log.read("t", session_id)][1:]
        assert bodies == [_chunk(f"{session_id}-{n}") for n in range(5)]


STALL_TIMEOUT = 2.0
"""The stall test's command timeout (the bare connection's reply timeout with it)."""


async def test_a_batch_on_a_stalled_redis_fails_within_one_timeout_and_lands_once() -> None:
    """SIGSTOP: the batch's bare call waits its reply timeout, and the call made again
    through the client only what is left of it; after SIGCONT the batch made again with
    its call ids lands once (the stalled server may still run what it was sent)."""
    with restartable_redis(aof=False) as server:
        store = connect(server.url, timeout=STALL_TIMEOUT)
        log = SessionLog(store)
        try:
            created = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}
            await log.create("t", "s", created)
            await log.append_many([("t", "s", _chunk("warm"), "")])  # the bare connection
            items = [("t", "s", _chunk(str(i)), "") for i in range(8)]
            calls = call_ids(len(items))
            server.pause()
            try:
                waited = await _seconds_to_fail(log, items, calls)
            finally:
                server.resume()
            assert STALL_TIMEOUT * 0.9 <= waited < STALL_TIMEOUT * 2 - 0.5, waited
            again = await log.append_many(items, calls)  # as the agent host does
            assert all(isinstance(p, Position) for p in again), again
            events = await log.read("t", "s")
            assert [e.body for e in events[1:]] == [_chunk("warm")] + [b for *_, b, _ in items]
            assert [e.seq for e in events] == list(range(1, 11))
        finally:
            log.close()
            await store.aclose()


async def _seconds_to_fail(log: SessionLog, items: list[Any], calls: list[str]) -> float:
    """How long ``items`` took to fail as a store out of reach fails them."""
    started = time.monotonic()
    with pytest.raises(STORE_AWAY):
        await log.append_many(items, calls)
    return time.monotonic() - started


HANDSHAKE_STALL = 1.5
"""How long the password test's server is stopped while the bare connection's AUTH waits."""


async def test_a_batch_whose_first_open_stalls_in_its_handshake_fails_within_its_deadline() -> None:
    """A server with a password, SIGSTOPped: the kernel still accepts the bare connection's
    first open, and its AUTH waits until SIGCONT, while the server holds every write
    (``CLIENT PAUSE WRITE``). The open and the script call share the batch's one deadline
    (the reply timeout): the batch fails then, not a whole reply timeout after the late
    handshake. Once writes go on, the batch made again with its call ids lands once."""
    with restartable_redis(aof=False) as server:
        url = server.require_password("s3cret")
        store = connect(url, timeout=STALL_TIMEOUT)
        log = SessionLog(store)
        admin = redis.Redis.from_url(url)
        try:
            created = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}
            await log.create("t", "s", created)  # through the client: no bare connection yet
            items = [("t", "s", _chunk(str(i)), "") for i in range(8)]
            calls = call_ids(len(items))
            admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
            server.pause()
            resumed = asyncio.get_running_loop().call_later(HANDSHAKE_STALL, server.resume)
            try:
                waited = await _seconds_to_fail(log, items, calls)
            finally:
                resumed.cancel()
                server.resume()
                admin.execute_command("CLIENT", "UNPAUSE")
            # Without the shared deadline: HANDSHAKE_STALL, then a whole reply timeout.
            assert STALL_TIMEOUT * 0.9 <= waited < STALL_TIMEOUT + 0.6, waited
            for _ in range(2):  # on a bare connection opened again, then on that one
                again = await log.append_many(items, calls)
                assert all(isinstance(p, Position) for p in again), again
            events = await log.read("t", "s")
            assert [e.body for e in events[1:]] == [b for *_, b, _ in items]
            assert [e.seq for e in events] == list(range(1, 10))
        finally:
            admin.close()
            log.close()
            await store.aclose()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_batch_whose_script_the_server_forgot_loads_it_on_the_bare_connection(
    store: Any, store_kind: str
) -> None:
    """A server that forgot the script answers the bare call NOSCRIPT at once: the script is
    loaded on the same bare connection and the batch made there again, never through the
    client (one path per call)."""
    log = SessionLog(store)
    through_client = 0
    script = log.appender.calls.run_script

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal through_client
        through_client += 1
        return await script(*args, **kwargs)

    log.appender.calls.run_script = counted  # type: ignore[method-assign]
    try:
        created = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}
        await log.create("t", "s", created)
        await log.append_many([("t", "s", _chunk("0"), "")])
        before = through_client
        await store.script_flush()
        await log.append_many([("t", "s", _chunk("1"), "")])
        assert through_client == before
        await log.append_many([("t", "s", _chunk("2"), "")])  # loaded again: the bare call
        assert through_client == before
        events = await log.read("t", "s")
        assert [e.body for e in events[1:]] == [_chunk(str(i)) for i in range(3)]
    finally:
        log.close()


async def test_a_batch_leaves_what_appends_one_at_a_time_leave(store: Any) -> None:
    """The batch script takes the call's shared values once and each event's flags in one
    argument: every event still lands as ``append`` lands it (bounds, updatedAt, the feed's
    index-neutral notices, the hot and deleted sets)."""
    log = SessionLog(store, max_events=3)
    created = {"type": "created", "cwd": "/w", "agent": "demo", "kind": "shell"}
    info = {"type": "update", "update": {"sessionUpdate": "session_info_update", "title": "T"}}
    bodies: list[dict[str, Any]] = [
        _chunk("a"),
        info,
        {"type": "status", "status": "STOPPED"},
        _chunk("over the bound"),
        {"type": "notice", "title": "full", "text": "why"},
        {"type": "deleted"},
    ]
    await log.create("t", "one", created)
    await log.create("t", "many", created)
    singly: list[Any] = []
    for body in bodies:
        try:
            singly.append(await log.append("t", "one", body))
        except SessionFull as exc:  # what append_many returns in its place
            singly.append(exc)
    batched = await log.append_many([("t", "many", body, "") for body in bodies])
    assert [type(r) for r in batched] == [type(r) for r in singly]
    assert [r.seq for r in batched if isinstance(r, Position)] == [2, 3, 4, 5, 6]

    def shown(raw: dict[str, str]) -> dict[str, str]:
        return {
            k: v for k, v in raw.items() if k not in ("created", "updated", "calls", "sid", "epoch")
        }

    keys = {sid: session_keys("t", sid) for sid in ("one", "many")}
    snaps = {sid: await store.hgetall(k.snapshot) for sid, k in keys.items()}
    assert shown(snaps["many"]) == shown(snaps["one"])
    assert ("updated" in snaps["many"]) == ("updated" in snaps["one"])

    async def notices(sid: str) -> list[tuple[str, bool]]:
        entries = await store.xrange(keys[sid].feed)
        return [(f["q"], "u" in f) for _, f in entries if f["s"] == sid]

    assert await notices("many") == await notices("one")
    for sid, k in keys.items():
        assert await store.zscore(k.hot, k.member) is not None, sid
        assert await store.zscore(k.deleted, k.member) is not None, sid
