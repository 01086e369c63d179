"""``session/fork`` (ACP unstable) on the demo agent: the fork has its own log, starting with
the parent's history up to the fork; it is listed, and live in every window like any session.
Offered only where the session's agent advertises ``sessionCapabilities.fork``."""

from __future__ import annotations

from typing import Any

import pytest

from broker.serve import Broker
from broker.store.events import EventType
from broker.store.log import SessionLog

from .support.client import text
from .support.wire import CheckedClient


@pytest.mark.parametrize("version", [1, 2])
async def test_a_fork_starts_with_the_parents_history_and_is_live_everywhere(
    broker: Broker, url: str, version: int
) -> None:
    mcp: dict[str, Any] = {"mcpServers": []} if version == 1 else {}
    client = await CheckedClient.open(url, version)
    parent = await client.new(cwd="/tmp/fork", **mcp)
    await client.call("session/prompt", {"sessionId": parent, "prompt": text("/notool first")})
    if version == 2:
        await client.until_idle(parent)

    reply = await client.call("session/fork", {"sessionId": parent, "cwd": "/tmp/fork", **mcp})
    child = reply["result"]["sessionId"]
    assert child != parent and child.startswith("sess_")

    # Its own log: created (with where it came from), then the parent's conversation.
    log = SessionLog(broker.redis)
    events = await log.read(broker.settings.tenant, child)
    assert events[0].type == EventType.CREATED
    assert events[0].body["forkedFrom"]["sessionId"] == parent
    parent_events = await log.read(broker.settings.tenant, parent)
    conversation = {EventType.PROMPT, EventType.PROMPT_END, EventType.UPDATE}
    assert [e.body for e in events if e.type in conversation][:3] == [
        e.body for e in parent_events if e.type in conversation
    ][:3]

    # Listed, and live in another window that resumes it.
    listed = await client.call("session/list", {"cwd": "/tmp/fork"})
    assert {s["sessionId"] for s in listed["result"]["sessions"]} == {parent, child}
    other = await CheckedClient.open(url, version)
    resumed = await other.call("session/resume", {"sessionId": child, "cwd": "/tmp/fork"})
    assert "result" in resumed, resumed
    reply = await client.call(
        "session/prompt", {"sessionId": child, "prompt": text("/notool in the fork")}
    )
    assert "result" in reply, reply
    kind = "user_message" if version == 2 else "user_message_chunk"
    await other.read_until(lambda: kind in other.kinds(child))
    await other.read_until(lambda: "You said: /notool in the fork" in other.texts(child))
    # The parent did not change.
    assert (await log.snapshot(broker.settings.tenant, parent)).seq == parent_events[-1].seq
    for each in (client, other):
        await each.close()


async def test_a_session_whose_agent_cannot_fork_is_refused_naming_the_capability(
    url: str,
) -> None:
    client = await CheckedClient.open(url, 1)
    plain = await client.new(cwd="/tmp/fork", mcpServers=[], _meta={"acpBroker/agent": "plain"})
    reply = await client.call("session/fork", {"sessionId": plain, "cwd": "/tmp/fork"})
    assert reply["error"]["code"] == -32602
    assert "sessionCapabilities.fork" in reply["error"]["message"]
    nope = "sess_" + "0" * 32
    missing = await client.call("session/fork", {"sessionId": nope, "cwd": "/tmp/fork"})
    assert missing["error"]["code"] == -32002
    assert missing["error"]["data"] == {"sessionId": nope}
    await client.close()
