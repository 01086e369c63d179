"""Notices (ACP ``notice`` updates, v1 and v2): the broker's own (an agent that could not be
given its session back started afresh) and an agent's. Sent as notices to clients that take
them (v2: every client; v1: those that advertise ``session.notices``), as an
``agent_message_chunk`` marked ``_meta["acpBroker/notice"]`` to the others; live only, so a
replay leaves them out for clients that take them (the notices RFD)."""

from __future__ import annotations

import os
import signal
from typing import Any

import websockets

from broker.protocol import render, v2_render
from broker.serve import Broker
from broker.store.events import EventType, LogEvent

from .support.client import text, wait_for
from .support.schemas import _by_method, _validator
from .support.wire import CheckedClient

NOTICES_V1 = {"protocolVersion": 1, "clientCapabilities": {"session": {"notices": {}}}}
AGENT_NOTICE = {
    "sessionUpdate": "notice",
    "severity": "info",
    "title": "MCP server unavailable",
    "description": "Continuing without it.",
}


def _event(body: dict[str, Any]) -> LogEvent:
    return LogEvent(seq=3, epoch="e1", ts=0, body=body)


def _valid(version: int, value: Any) -> None:
    name = _by_method(version, "client", "Notification")["session/update"]
    errors = list(_validator(version, name).iter_errors(value))
    assert not errors, errors[0]


def test_notices_render_as_each_viewer_takes_them() -> None:
    broker_notice = _event({"type": EventType.NOTICE, "title": "Started afresh", "text": "why"})
    agent_notice = _event({"type": EventType.UPDATE, "update": AGENT_NOTICE})
    for event in (broker_notice, agent_notice):
        assert render.is_notice(event)
        [v1_notice] = render.session_updates(event, "sess_1", notices=True)
        [v1_chunk] = render.session_updates(event, "sess_1", notices=False)
        [v2_notice] = v2_render.session_updates(event, "sess_1", None)
        for version, message in ((1, v1_notice), (1, v1_chunk), (2, v2_notice)):
            _valid(version, message["params"])
        assert v1_notice["params"]["update"]["sessionUpdate"] == "notice"
        assert v2_notice["params"]["update"]["sessionUpdate"] == "notice"
        chunk = v1_chunk["params"]["update"]
        assert chunk["sessionUpdate"] == "agent_message_chunk"
        assert chunk["_meta"] == {"acpBroker/notice": True}
    [ours] = render.session_updates(broker_notice, "sess_1", notices=True)
    assert ours["params"]["update"]["title"] == "Started afresh"
    assert ours["params"]["update"]["description"] == "why"
    [theirs] = render.session_updates(agent_notice, "sess_1", notices=False)
    assert theirs["params"]["update"]["content"]["text"] == (
        "MCP server unavailable: Continuing without it."
    )
    assert not render.is_notice(_event({"type": EventType.UPDATE, "update": {"x": 1}}))


def test_which_clients_take_notices() -> None:
    assert render.client_sees_notices(2, {})
    assert render.client_sees_notices(1, {"session": {"notices": {}}})
    assert not render.client_sees_notices(1, {})
    assert not render.client_sees_notices(1, {"session": {"notices": None}})


async def _open(url: str, version: int, init: dict[str, Any] | None = None) -> CheckedClient:
    if init is None:
        return await CheckedClient.open(url, version)
    client = CheckedClient(await websockets.connect(url), version)
    assert (await client.call("initialize", init))["result"]["protocolVersion"] == version
    return client


def _notices(client: CheckedClient, session_id: str) -> list[dict[str, Any]]:
    return [
        u["update"] for u in client.updates(session_id) if u["update"]["sessionUpdate"] == "notice"
    ]


def _stand_ins(client: CheckedClient, session_id: str) -> list[dict[str, Any]]:
    return [
        u["update"]
        for u in client.updates(session_id)
        if (u["update"].get("_meta") or {}).get("acpBroker/notice")
        and u["update"]["sessionUpdate"] == "agent_message_chunk"
    ]


async def test_the_brokers_notice_goes_live_to_each_client_as_it_takes_it(
    broker: Broker, url: str
) -> None:
    taker = await _open(url, 1, NOTICES_V1)
    session_id = await taker.new(
        cwd="/tmp/notice", mcpServers=[], _meta={"acpBroker/agent": "plain"}
    )
    plain_v1 = await _open(url, 1)
    v2 = await _open(url, 2)
    for client in (plain_v1, v2):
        assert "result" in await client.call(
            "session/resume", {"sessionId": session_id, "cwd": "/tmp/notice"}
        )
    # The plain agent can neither load nor resume: killed, it comes back afresh, with a notice.
    assert broker.worker is not None
    pid = broker.worker.host.agent_pid("plain")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    async def errored() -> bool:
        return (await broker.log.snapshot(broker.settings.tenant, session_id)).status == "ERROR"

    await wait_for(errored, what="the session marked ERROR")
    reply = await taker.call("session/prompt", {"sessionId": session_id, "prompt": text("again")})
    assert reply["result"]["stopReason"] == "end_turn"
    await taker.read_until(lambda: _notices(taker, session_id))
    await plain_v1.read_until(lambda: _stand_ins(plain_v1, session_id))
    await v2.read_until(lambda: _notices(v2, session_id))
    [notice] = _notices(taker, session_id)
    assert notice["severity"] == "warning" and "afresh" in notice["title"]
    assert _notices(v2, session_id) == [notice]
    assert "afresh" in _stand_ins(plain_v1, session_id)[0]["content"]["text"]
    assert not _stand_ins(taker, session_id) and not _notices(plain_v1, session_id)

    # Replay: notices are live only; the stand-in, an agent message, is replayed.
    later = await _open(url, 1, NOTICES_V1)
    await later.call(
        "session/load", {"sessionId": session_id, "cwd": "/tmp/notice", "mcpServers": []}
    )
    assert not _notices(later, session_id) and not _stand_ins(later, session_id)
    assert "plain:" in later.texts(session_id)
    fallback = await _open(url, 1)
    await fallback.call(
        "session/load", {"sessionId": session_id, "cwd": "/tmp/notice", "mcpServers": []}
    )
    assert len(_stand_ins(fallback, session_id)) == 1
    v2_later = await _open(url, 2)
    await v2_later.call(
        "session/resume",
        {"sessionId": session_id, "cwd": "/tmp/notice", "replayFrom": {"type": "start"}},
    )
    assert not _notices(v2_later, session_id) and "user_message" in v2_later.kinds(session_id)
    for client in (taker, plain_v1, v2, later, fallback, v2_later):
        await client.close()
