"""acpx (npm, a third-party ACP client nobody here wrote) drives the broker through the stdio
bridge: ``acpx --agent 'acp-broker connect URL'``, as its users would.

acpx is installed from ``tests/ts/package-lock.json`` beside the TypeScript SDK peers
(:mod:`.support.node_peers`). Each acpx user has a HOME of its own (acpx keeps its
session records there). What the broker then holds is read back over a raw ACP connection
(checked against the official schemas).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.serve import Broker
from broker.store.client import connect
from broker.store.events import EventType

from .conftest import ROOT, demo_agent, make_settings, subprocess_env
from .support.client import RawClient, wait_for
from .support.node_peers import node_peers

TIMEOUT = 90.0


@pytest.fixture(scope="module")
def acpx() -> Path:
    return node_peers() / "node_modules" / "acpx" / "dist" / "cli.js"


@pytest.fixture
async def node() -> AsyncIterator[Broker]:
    store = connect(None)
    broker = Broker(make_settings(agents=[demo_agent()]), redis=store)
    await broker.start()
    yield broker
    await broker.stop()
    await store.aclose()


class Acpx:
    """One acpx user (a HOME of its own) working in ``cwd`` on the broker at ``url``."""

    def __init__(self, cli: Path, url: str, home: Path, cwd: Path) -> None:
        self.cli, self.url, self.home, self.cwd = cli, url, home, cwd
        home.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)

    @property
    def agent(self) -> str:
        return f"{sys.executable} -m broker.cli connect {self.url}"

    async def run(self, *args: str, fresh: bool = True) -> str:
        """``acpx --agent BRIDGE --cwd CWD --ttl 1 ARGS…``: its stdout (exit 0 checked).
        ``fresh``: once the bridges of earlier commands are gone (acpx keeps its agent
        process a second after a command, and refuses one that comes as it shuts down), so
        that this one loads the saved session through a bridge of its own."""
        if fresh:
            await wait_for(lambda: self.bridges() == 0, timeout=30)
        env = {**subprocess_env(), "HOME": str(self.home), "PYTHONPATH": str(ROOT)}
        cmd = ["node", str(self.cli), "--agent", self.agent, "--cwd", str(self.cwd)]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            "--ttl",
            "1",
            "--approve-all",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=str(self.cwd),
        )
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
        assert proc.returncode == 0, f"acpx {args} exited {proc.returncode}: {err.decode()}"
        return out.decode()

    def bridges(self) -> int:
        """How many of this broker's bridges (acpx's agent processes) run now."""
        count = 0
        for pid in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except (OSError, ValueError):
                continue
            count += f"connect {self.url}".encode() in cmdline
        return count


async def _history(url: str, session_id: str, cwd: Path) -> dict[str, Any]:
    """A fresh window's load of the session: its reply and the user's prompts replayed."""
    client = await RawClient.initialized(url)
    try:
        reply = await client.call(
            "session/load", {"sessionId": session_id, "cwd": str(cwd), "mcpServers": []}
        )
        users = [
            u["update"]["content"]["text"]
            for u in client.updates(session_id)
            if u["update"]["sessionUpdate"] == "user_message_chunk"
        ]
    finally:
        await client.close()
    return {"reply": reply["result"], "users": users}


async def test_acpx_exec_through_the_bridge(acpx: Path, node: Broker, tmp_path: Path) -> None:
    user = Acpx(acpx, f"ws://127.0.0.1:{node.port}/acp", tmp_path / "home", tmp_path / "w")
    out = await user.run("--format", "quiet", "exec", "/notool one shot")
    assert "You said: /notool one shot" in out


async def test_acpx_sessions_modes_cancel_and_two_users_on_one_session(
    acpx: Path, node: Broker, tmp_path: Path
) -> None:
    url = f"ws://127.0.0.1:{node.port}/acp"
    cwd = tmp_path / "project"
    ann = Acpx(acpx, url, tmp_path / "ann", cwd)
    session_id = (await ann.run("sessions", "new", "--name", "s1")).strip().splitlines()[-1]
    assert session_id.startswith("sess_")
    assert "You said: /notool first" in await ann.run(
        "--format", "quiet", "prompt", "-s", "s1", "/notool first"
    )

    # A saved session, reloaded by a fresh bridge (each command's: see Acpx.run).
    out = await ann.run("--format", "quiet", "prompt", "-s", "s1", "/notool second")
    assert "You said: /notool second" in out
    assert "mode set: code" in await ann.run("set-mode", "code", "-s", "s1")

    # Cancel a turn that streams.
    slow = asyncio.ensure_future(ann.run("--format", "quiet", "prompt", "-s", "s1", "/slow 100"))
    await wait_for(lambda: _streaming(node, session_id, "/slow 100"), timeout=30)
    said = await ann.run("cancel", "-s", "s1", fresh=False)  # to the prompt's own acpx
    assert "cancel requested" in said, said
    await slow
    ends = await _prompt_ends(node, session_id)
    assert ends[-1] == "cancelled"

    # Another user on the same broker session.
    bob = Acpx(acpx, url, tmp_path / "bob", cwd)
    await bob.run("sessions", "new", "--name", "shared", "--resume-session", session_id)
    out = await bob.run("--format", "quiet", "prompt", "-s", "shared", "/notool from bob")
    assert "You said: /notool from bob" in out

    seen = await _history(url, session_id, cwd)
    assert seen["users"] == ["/notool first", "/notool second", "/slow 100", "/notool from bob"]
    assert seen["reply"]["modes"]["currentModeId"] == "code"  # the window, whole


async def _streaming(node: Broker, session_id: str, words: str) -> bool:
    """Whether the session's running turn, the prompt ``words``, has streamed a chunk yet."""
    events = await node.log.read("default", session_id)
    prompts = [i for i, e in enumerate(events) if e.type == EventType.PROMPT]
    if not prompts or events[prompts[-1]].body["prompt"][0].get("text") != words:
        return False
    return any(
        (e.body.get("update") or {}).get("sessionUpdate") == "agent_message_chunk"
        for e in events[prompts[-1] :]
    )


async def _prompt_ends(node: Broker, session_id: str) -> list[str]:
    events = await node.log.read("default", session_id)
    return [str(e.body.get("stopReason")) for e in events if e.type == EventType.PROMPT_END]
