"""Honest capabilities: what is advertised is what every agent advertised, and a session's
agent is never sent what it did not advertise (-32602 naming the capability).

The broker of these tests runs the demo agent (images, embedded context, HTTP MCP
servers, fork) and the plain agent (nothing beyond the baseline).
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.protocol import capabilities
from broker.protocol.jsonrpc import RpcError

from .support.client import text
from .support.wire import CheckedClient

DEMO: dict[str, Any] = {
    "promptCapabilities": {"image": True, "embeddedContext": True},
    "mcpCapabilities": {"http": True},
    "sessionCapabilities": {"fork": {}, "resume": {}},
}
IMAGE = {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="}
RESOURCE = {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "a"}}
HTTP_MCP = {"type": "http", "name": "web", "url": "http://127.0.0.1:1/mcp", "headers": []}


# -- units ------------------------------------------------------------------------------------


def test_combined_is_what_every_agent_advertised() -> None:
    both = capabilities.combined(["demo", "plain"], {"demo": DEMO, "plain": {}})
    assert both["promptCapabilities"] == {"image": False, "audio": False, "embeddedContext": False}
    assert both["mcpCapabilities"] == {"http": False, "sse": False} and both["fork"] is False
    alone = capabilities.combined(["demo"], {"demo": DEMO})
    assert alone["promptCapabilities"] == {"image": True, "audio": False, "embeddedContext": True}
    assert alone["mcpCapabilities"] == {"http": True, "sse": False} and alone["fork"] is True
    # An agent that has not started yet (unknown) advertises nothing.
    unknown = capabilities.combined(["demo", "later"], {"demo": DEMO})
    assert not any(unknown["promptCapabilities"].values()) and unknown["fork"] is False


@pytest.mark.parametrize(
    ("block", "named"),
    [
        (IMAGE, "promptCapabilities.image"),
        ({"type": "audio", "mimeType": "audio/wav", "data": "UklG"}, "promptCapabilities.audio"),
        (RESOURCE, "promptCapabilities.embeddedContext"),
    ],
)
def test_prompt_content_beyond_the_baseline_needs_the_capability(
    block: dict[str, Any], named: str
) -> None:
    with pytest.raises(RpcError) as refused:
        capabilities.check_prompt("plain", {}, [{"type": "text", "text": "hi"}, block])
    assert refused.value.code == -32602 and named in refused.value.message
    assert refused.value.data == {"capability": named, "agent": "plain"}
    link = {"type": "resource_link", "uri": "file:///a", "name": "a"}
    capabilities.check_prompt("plain", {}, [{"type": "text", "text": "hi"}, link])  # baseline


def test_mcp_transports_beyond_stdio_need_the_capability() -> None:
    stdio = {"name": "s", "command": "/bin/true", "args": [], "env": []}
    capabilities.check_mcp_servers("plain", {}, [stdio])
    capabilities.check_mcp_servers("demo", DEMO, [stdio, HTTP_MCP])
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({}, HTTP_MCP, "http"),
        (DEMO, {**HTTP_MCP, "type": "sse"}, "sse"),
    ]
    for caps, server, named in cases:
        with pytest.raises(RpcError) as refused:
            capabilities.check_mcp_servers("an agent", caps, [server])
        assert refused.value.code == -32602, named
        assert f"mcpCapabilities.{named}" in refused.value.message


def test_v1_and_v2_advertise_the_same_combination() -> None:
    alone = capabilities.combined(["demo"], {"demo": DEMO})
    v1 = capabilities.v1_agent_capabilities(alone)
    assert v1["mcpCapabilities"] == {"http": True, "sse": False}
    assert v1["sessionCapabilities"]["fork"] == {} and v1["sessionCapabilities"]["title"] == {}
    v2 = capabilities.v2_session_capabilities(alone)
    assert v2["prompt"] == {"image": {}, "embeddedContext": {}}
    assert v2["mcp"] == {"stdio": {}, "http": {}} and v2["fork"] == {}
    both = capabilities.combined(["demo", "plain"], {"demo": DEMO, "plain": {}})
    assert "fork" not in capabilities.v1_agent_capabilities(both)["sessionCapabilities"]
    assert capabilities.v2_session_capabilities(both)["mcp"] == {"stdio": {}}


# -- against a broker ---------------------------------------------------------------------------


async def test_initialize_claims_nothing_the_plain_agent_lacks(url: str) -> None:
    for version in (1, 2):
        client = await CheckedClient.open(url, version)
        await client.new(_meta={"acpBroker/agent": "plain"}, **_v1_mcp(version))
        await client.new(**_v1_mcp(version))  # both agents have started: both are known
        await client.close()
    v1 = await CheckedClient.open(url, 1)
    caps = next(m for m in v1.received if "result" in m)["result"]["agentCapabilities"]
    assert caps["promptCapabilities"] == {"image": False, "audio": False, "embeddedContext": False}
    assert caps["mcpCapabilities"] == {"http": False, "sse": False}
    assert "fork" not in caps["sessionCapabilities"] and caps["sessionCapabilities"]["title"] == {}
    await v1.close()


@pytest.mark.parametrize("version", [1, 2])
async def test_what_the_sessions_agent_did_not_advertise_is_refused(url: str, version: int) -> None:
    client = await CheckedClient.open(url, version)
    plain = await client.new(_meta={"acpBroker/agent": "plain"}, **_v1_mcp(version))
    for block, named in ((IMAGE, "image"), (RESOURCE, "embeddedContext")):
        reply = await client.call(
            "session/prompt", {"sessionId": plain, "prompt": [*text("look"), block]}
        )
        assert reply["error"]["code"] == -32602, reply
        assert f"promptCapabilities.{named}" in reply["error"]["message"]
    # Nothing of the refused prompts reached the log: the session's next prompt is its first.
    reply = await client.call("session/prompt", {"sessionId": plain, "prompt": text("hi")})
    assert "result" in reply, reply
    listed = await client.call("session/list", {})
    [info] = [s for s in listed["result"]["sessions"] if s["sessionId"] == plain]
    assert "title" not in info or info["title"] in (None, "hi")
    # An HTTP MCP server for the plain agent is refused before it is started.
    refused = await client.call(
        "session/new",
        {"cwd": "/tmp/caps", "mcpServers": [HTTP_MCP], "_meta": {"acpBroker/agent": "plain"}},
    )
    assert refused["error"]["code"] == -32602
    assert "mcpCapabilities.http" in refused["error"]["message"]
    # The demo agent advertised both: its sessions take them.
    demo = await client.new(mcpServers=[HTTP_MCP])
    reply = await client.call(
        "session/prompt", {"sessionId": demo, "prompt": [*text("/notool look"), IMAGE]}
    )
    assert "result" in reply, reply
    await client.close()


def _v1_mcp(version: int) -> dict[str, Any]:
    return {"mcpServers": []} if version == 1 else {}
