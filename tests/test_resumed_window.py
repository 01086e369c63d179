"""A resumed window is whole: ``session/load`` and ``session/resume`` answer with the
session's current modes and config options as the agent last stated them, whether or not
an agent process already holds the session, in v1 and v2 (every reply checked against the
official schemas by :class:`RawClient`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.serve import Broker
from broker.store import log as log_module
from broker.store.archive import DirectoryArchive
from broker.store.client import connect
from broker.store.events import LogEvent, dumps, fold, snapshot_ops, window_fields
from broker.store.keys import SessionKeys
from broker.store.log import SessionLog, new_session_id
from broker.store.window import window_event, window_of, window_ops, with_window
from workers.projector.archiving import Archiver

from .conftest import demo_agent, make_settings
from .support.client import RawClient, wait_for
from .test_archive import archive_now

CWD = "/work/window"
TENANT = "default"


async def _window(url: str, method: str, session_id: str, **extra: Any) -> dict[str, Any]:
    """The reply of a fresh window's ``method`` (load, resume) of the session."""
    client = await RawClient.initialized(url)
    try:
        params = {"sessionId": session_id, "cwd": CWD, "mcpServers": [], **extra}
        reply = await client.call(method, params)
    finally:
        await client.close()
    assert "result" in reply, reply
    return dict(reply["result"])


async def test_a_second_window_gets_the_new_sessions_window_then_its_changes(url: str) -> None:
    first = await RawClient.initialized(url)
    created = await first.call("session/new", {"cwd": CWD, "mcpServers": []})
    new = created["result"]
    session_id = new["sessionId"]
    assert new["modes"]["currentModeId"] == "ask" and new["configOptions"]

    # The agent holds the session already: it would answer {}; the broker answers whole.
    for method in ("session/load", "session/resume"):
        reply = await _window(url, method, session_id)
        assert reply["modes"] == new["modes"], method
        assert reply["configOptions"] == new["configOptions"], method

    # A mode the client set, and an option: the next window shows them.
    assert "result" in await first.call(
        "session/set_mode", {"sessionId": session_id, "modeId": "code"}
    )
    option = await first.call(
        "session/set_config_option",
        {"sessionId": session_id, "configId": "style", "value": "shouty"},
    )
    options = option["result"]["configOptions"]
    reply = await _window(url, "session/resume", session_id)
    assert reply["modes"] == {**new["modes"], "currentModeId": "code"}
    assert reply["configOptions"] == options
    await first.close()


async def test_a_v2_window_resumes_with_the_config_options(url: str) -> None:
    first = await RawClient.initialized(url)
    new = (await first.call("session/new", {"cwd": CWD, "mcpServers": []}))["result"]
    await first.close()
    v2 = await RawClient.connect(url)
    try:
        await v2.call("initialize", {"protocolVersion": 2, "capabilities": {}})
        reply = await v2.call(
            "session/resume", {"sessionId": new["sessionId"], "cwd": CWD, "mcpServers": []}
        )
    finally:
        await v2.close()
    # v2 has no modes: the same options, named as v2 names them (the schema checked them).
    ids = [option["configId"] for option in reply["result"]["configOptions"]]
    assert ids == [option["id"] for option in new["configOptions"]]


# -- archived: the window leaves the snapshot, and comes back ----------------------------------


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client = connect(redis_url)
    yield client
    await client.aclose()


@pytest.fixture(params=[60.0, 1.0], ids=["held", "let-go"])
async def real_broker(
    request: pytest.FixtureRequest, redis: Any, tmp_path: Path
) -> AsyncIterator[Broker]:
    """A broker on a real Redis whose agent host keeps an archived session for a while
    (``held``: it renews its leases every 20 s) or gives it up at once (``let-go``), and
    whose demo agent keeps its sessions' modes and options on disk, as agents that can load
    a session do (else a restored agent states its defaults, and is believed)."""
    agent = demo_agent(ACP_DEMO_STATE_DIR=str(tmp_path / "agent"))
    node = Broker(make_settings(lease_ttl=request.param, agents=[agent]), redis=redis)
    await node.start()
    yield node
    await node.stop()


def _window_fields(snap: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in snap.items() if name.startswith("w:")}


async def test_an_archived_session_reopens_with_its_window(
    real_broker: Broker, redis: Any, request: pytest.FixtureRequest
) -> None:
    broker = real_broker
    url = f"ws://127.0.0.1:{broker.port}/acp"
    first = await RawClient.initialized(url)
    new = (await first.call("session/new", {"cwd": CWD, "mcpServers": []}))["result"]
    session_id = new["sessionId"]
    await first.call("session/set_mode", {"sessionId": session_id, "modeId": "code"})
    option = await first.call(
        "session/set_config_option",
        {"sessionId": session_id, "configId": "style", "value": "shouty"},
    )
    await first.close()
    expected = {
        "modes": {**new["modes"], "currentModeId": "code"},
        "configOptions": option["result"]["configOptions"],
    }
    keys = SessionKeys(TENANT, session_id)
    assert _window_fields(await redis.hgetall(keys.snapshot)), "kept while the log is hot"

    await archive_now(broker, session_id)
    # A listpack, without the window (JSON far over hash-max-listpack-value).
    assert await redis.object("encoding", keys.snapshot) == "listpack"
    assert not _window_fields(await redis.hgetall(keys.snapshot))
    assert await broker.log.window(TENANT, session_id) == expected  # folded from the archive
    if request.node.callspec.id == "let-go":

        async def let_go() -> bool:
            return not await redis.exists(keys.lease)

        await wait_for(let_go, 10.0, "the host to give the archived session's lease up")

    # Reopened in a new window, held by its agent (which replies {}) or restored onto one.
    for method in ("session/load", "session/resume"):
        reply = await _window(url, method, session_id)
        assert reply["modes"] == expected["modes"], method
        assert reply["configOptions"] == expected["configOptions"], method
    await broker.log.restore(TENANT, session_id)  # where the host held it: nothing appended
    assert (await broker.log.snapshot(TENANT, session_id)).window == expected


async def test_a_restore_sets_the_window_the_log_folds_into(
    redis: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "RESTORE_CHUNK", 3)  # the window goes with the last part
    session_log = SessionLog(redis, archive=DirectoryArchive(tmp_path))
    session_id = new_session_id()
    await session_log.create(TENANT, session_id, {"type": "created", "cwd": "/w"})
    bodies = [
        window_event({"modes": MODES, "configOptions": OPTIONS}),
        _update("current_mode_update", currentModeId="code"),
        *[_update("agent_message_chunk", content={"type": "text", "text": "x"})] * 5,
        _update("config_option_update", configOptions=[{"id": "style", "currentValue": "x"}]),
    ]
    for body in bodies:
        assert body is not None
        await session_log.append(TENANT, session_id, body)
    keys = SessionKeys(TENANT, session_id)
    hot = _window_fields(await redis.hgetall(keys.snapshot))
    assert set(hot) == {"w:modes", "w:currentModeId", "w:configOptions"}

    archiver = Archiver(redis, DirectoryArchive(tmp_path), session_log=session_log)
    assert await archiver.archive_session(TENANT, session_id) == len(bodies) + 1
    assert await redis.object("encoding", keys.snapshot) == "listpack"
    assert not _window_fields(await redis.hgetall(keys.snapshot))
    await session_log.restore(TENANT, session_id)
    restored = await redis.hgetall(keys.snapshot)
    assert _window_fields(restored) == hot and "archived" not in restored


def _update(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": "update", "update": {"sessionUpdate": kind, **fields}}


# -- the pure part ---------------------------------------------------------------------------


MODES = {"currentModeId": "ask", "availableModes": [{"id": "ask"}, {"id": "code"}]}
OPTIONS = [{"id": "style", "currentValue": "plain"}]


def _event(seq: int, body: dict[str, Any]) -> LogEvent:
    return LogEvent(seq, "e", seq, body)


def test_the_window_folds_from_replies_and_the_agents_notifications() -> None:
    created = {"type": "created", "cwd": "/w"}
    reply = window_event({"sessionId": "x", "modes": MODES, "configOptions": OPTIONS})
    assert reply is not None
    mode = {
        "type": "update",
        "update": {"sessionUpdate": "current_mode_update", "currentModeId": "code"},
    }
    changed = [{**OPTIONS[0], "currentValue": "shouty"}]
    option = {
        "type": "update",
        "update": {"sessionUpdate": "config_option_update", "configOptions": changed},
    }
    events = [_event(1, created), _event(2, reply), _event(3, mode), _event(4, option)]
    snapshot = fold("t", "s", events)
    assert snapshot is not None
    assert snapshot.window == {
        "modes": {**MODES, "currentModeId": "code"},
        "configOptions": changed,
    }
    # A later whole mode state (a restore's reply) is the current one again.
    again = window_event({"modes": MODES})
    assert again is not None
    snapshot = fold("t", "s", [*events, _event(5, again)])
    assert snapshot is not None and snapshot.window["modes"] == MODES


def test_a_set_mode_is_a_window_event_and_replies_without_a_window_make_none() -> None:
    assert window_event({}) is None and window_event(None) is None
    body = window_event({}, mode_id="code")
    assert body == {"type": "window", "window": {"modeId": "code"}}
    assert window_ops(body) == [("set", "w:currentModeId", "code")]
    assert snapshot_ops(body) == window_ops(body)
    assert window_of({"w:currentModeId": "code"}) == {}  # no modes stated: none shown


def test_a_reply_keeps_what_the_agent_stated_and_gains_what_it_left_out() -> None:
    window = {"modes": MODES, "configOptions": OPTIONS}
    assert with_window({}, window) == window
    fresh = {"modes": {**MODES, "currentModeId": "code"}, "_meta": {"k": 1}}
    assert with_window(fresh, window) == {**fresh, "configOptions": OPTIONS}
    assert with_window({"modes": None}, window)["modes"] == MODES
    assert with_window({}, {}) == {}


def test_the_window_fields_fold_from_the_events_texts_as_the_append_script_sets_them() -> None:
    stated = window_event({"modes": MODES, "configOptions": OPTIONS}, mode_id="code")
    restated = window_event({"modes": MODES})
    texts = [dumps(body) for body in (stated, _update("agent_thought_chunk"), restated)]
    assert window_fields(texts[:2]) == {
        "w:modes": dumps(MODES),
        "w:configOptions": dumps(OPTIONS),
        "w:currentModeId": "code",
    }
    # A whole mode state stated later: its current mode is the current one again.
    assert window_fields(texts) == {"w:modes": dumps(MODES), "w:configOptions": dumps(OPTIONS)}
    assert window_fields([dumps({"type": "prompt", "promptId": "p"})]) == {}
