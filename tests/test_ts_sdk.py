"""The official ACP TypeScript SDK (``@agentclientprotocol/sdk`` 2.4.0) as a third-party peer.

An agent written with the SDK (``tests/ts/agent.ts``, in the style of its example agent)
runs behind the broker; the SDK's v1 and v2 clients (``tests/ts/client.ts``) reach it over
WebSocket, over Streamable HTTP (the SDK's ``createHttpStream``) and through the stdio
bridge (``acp-broker connect``), each with node, through new, prompt (with a permission
request), an agent's notice, a cancelled turn (v1), set_title, list, fork, close,
load/replay, resume and delete. The SDK validates every message it receives against its protocol
types (generated from the same schemas as ``tests/schemas``).

Node.js and npm must be on the PATH (``.ci/run`` installs them); the SDK is installed
from ``tests/ts/package-lock.json`` with ``npm ci`` by ``make test`` (or, run without it,
once by the first test that needs it: :mod:`.support.node_peers`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.config import AgentSpec
from broker.serve import Broker
from broker.store.client import connect

from .conftest import ROOT, make_settings, subprocess_env
from .support.node_peers import node_peers

TS = Path(__file__).resolve().parent / "ts"
TSX = TS / "node_modules" / ".bin" / "tsx"


@pytest.fixture(scope="module")
def ts_peers() -> Path:
    """``tests/ts`` with its lockfile's packages installed (``npm ci``, once: see
    :mod:`.support.node_peers`)."""
    return node_peers()


@pytest.fixture
async def ts_broker(ts_peers: Path) -> AsyncIterator[Broker]:
    """A broker whose only agent is the TypeScript SDK agent (so its capabilities are all
    that is advertised)."""
    spec = AgentSpec(name="ts", command=[str(TSX), str(ts_peers / "agent.ts")])
    store = connect(None)
    node = Broker(make_settings(agents=[spec], prestart_agents=True), redis=store)
    await node.start()
    yield node
    await node.stop()
    await store.aclose()


async def run_client(version: str, transport: str, url: str) -> dict[str, Any]:
    env = subprocess_env()
    bridge = [sys.executable, "-m", "broker.cli", "connect", url]
    env["ACP_BRIDGE_COMMAND"] = json.dumps(bridge)
    proc = await asyncio.create_subprocess_exec(
        str(TSX),
        str(TS / "client.ts"),
        version,
        transport,
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    lines = out.decode().strip().splitlines()
    assert lines, f"no summary from the TS client (exit {proc.returncode}): {err.decode()}"
    summary: dict[str, Any] = json.loads(lines[-1])
    assert summary.get("ok"), f"{summary.get('error')}\n{err.decode()}"
    assert proc.returncode == 0
    return summary


@pytest.mark.parametrize("transport", ["ws", "http", "bridge"])
@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_the_typescript_sdk_clients_use_a_typescript_agent_through_the_broker(
    ts_broker: Broker, version: str, transport: str
) -> None:
    url = f"ws://127.0.0.1:{ts_broker.port}/acp"
    if transport == "http":  # Streamable HTTP: the HTTP port's /acp
        url = f"http://127.0.0.1:{ts_broker.http_port}/acp"
    summary = await run_client(version, transport, url)
    assert summary["reply"] == f"TS agent heard: hello from ts {version} (edited)"
    assert summary["forked"] is True  # the agent advertises fork, so the broker offers it
    # The agent's notice reached the client as a notice (v1: it advertised session.notices).
    [notice] = summary["notices"]
    assert notice["title"] == "TS agent notice" and notice["severity"] == "info"
    if version == "v1":
        caps = summary["capabilities"]
        assert caps["promptCapabilities"] == {
            "image": False,
            "audio": False,
            "embeddedContext": True,
        }
        assert caps["mcpCapabilities"] == {"http": False, "sse": False}
        assert summary["replayedUser"] == "hello from ts v1/noticecancel me"
        assert summary["cancelled"] == "cancelled"
    else:
        session = summary["capabilities"]["session"]
        assert session["prompt"] == {"embeddedContext": {}} and session["mcp"] == {"stdio": {}}
        assert summary["messageId"].endswith("_user")
