"""A resumed window is whole: ``session/load`` and ``session/resume`` answer with the
session's current modes and config options as the agent last stated them, whether or not
an agent process already holds the session, in v1 and v2 (every reply checked against the
official schemas by :class:`RawClient`)."""

from __future__ import annotations

from typing import Any

from broker.store.events import LogEvent, fold, snapshot_ops
from broker.store.window import window_event, window_of, window_ops, with_window

from .support.client import RawClient

CWD = "/work/window"


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
