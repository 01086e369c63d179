"""The stdio bridge outlives its front node: a deploy is a delay to the editor, nothing more.

Real processes on a real Redis: an agent host and a front-only node (``serve --no-workers``)
on a fixed port; an ``acp`` client (as an editor) runs ``acp-broker connect`` as its agent.
Mid-turn the front is killed (SIGKILL) or stopped (SIGTERM, close 1001); a replacement front
starts on the same address. The turn runs on at its agent host; the editor gets each of its
updates once, in order, and its prompt request the turn's real end. A permission question
open at the drop is asked again by the broker and reaches the editor once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from acp import Client, spawn_agent_process, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import ClientCapabilities, FileSystemCapabilities

from .support.broker_process import BrokerProcess, broker_env, broker_process
from .support.client import RecordingClient, wait_for
from .support.roles import role_process

TIMEOUT = 60.0
STOPS = pytest.mark.parametrize("stop", ["kill", "terminate"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def _front(redis_url: str, port: int, log: Path) -> AsyncIterator[BrokerProcess]:
    args = ["--no-workers", "--port", str(port), "--http-port", "0"]
    async with broker_process(redis_url, log_path=log, extra_args=args) as node:
        yield node


@contextlib.asynccontextmanager
async def _bridged(
    url: str, tmp_path: Path, client: RecordingClient
) -> AsyncIterator[tuple[ClientSideConnection, asyncio.subprocess.Process]]:
    with open(tmp_path / "bridge.stderr", "wb") as stderr:  # noqa: ASYNC230 - a local file
        async with spawn_agent_process(
            cast(Client, client),
            sys.executable,
            "-m",
            "broker.cli",
            "connect",
            url,
            env=broker_env(),
            transport_kwargs={"stderr": stderr},
        ) as (conn, process):
            caps = ClientCapabilities(
                fs=FileSystemCapabilities(read_text_file=False, write_text_file=False)
            )
            await conn.initialize(protocol_version=1, client_capabilities=caps)
            yield conn, process


async def _stop(node: BrokerProcess, how: str) -> None:
    if how == "kill":
        await node.kill()
    else:
        await node.terminate()


def _chunks(client: RecordingClient, session_id: str) -> list[str]:
    return [
        u.content.text
        for sid, u in client.updates
        if sid == session_id and u.session_update == "agent_message_chunk"
    ]


@STOPS
async def test_a_turn_streams_on_through_a_new_front_each_update_once(
    redis_url: str, tmp_path: Path, stop: str
) -> None:
    port = _free_port()
    url = f"ws://127.0.0.1:{port}/acp"
    client = RecordingClient()
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            role_process("agent-host", redis_url, tmp_path / "host.log")
        )
        front = await stack.enter_async_context(_front(redis_url, port, tmp_path / "f1.log"))
        conn, process = await stack.enter_async_context(_bridged(url, tmp_path, client))
        other = (await conn.new_session(cwd="/work/other", mcp_servers=[])).session_id
        session_id = (await conn.new_session(cwd="/work/bridged", mcp_servers=[])).session_id
        turn = asyncio.ensure_future(
            conn.prompt(session_id=session_id, prompt=[text_block("/slow 20")])
        )
        await wait_for(lambda: len(_chunks(client, session_id)) >= 3, timeout=20)
        await _stop(front, stop)
        async with _front(redis_url, port, tmp_path / "f2.log"):
            reply = await turn
            assert reply.stop_reason == "end_turn"
            assert _chunks(client, session_id) == [f"chunk {i}" for i in range(1, 21)]
            # The editor's own prompt was not echoed back by the replay.
            assert "user_message_chunk" not in client.kinds(session_id)
            # Both sessions are active on the new connection: a second turn streams too.
            again = await conn.prompt(session_id=other, prompt=[text_block("/chunks 2")])
            assert again.stop_reason == "end_turn"
            assert _chunks(client, other) == ["chunk 1", "chunk 2"]
        assert process.returncode is None  # the bridge never stopped
    stderr = (tmp_path / "bridge.stderr").read_text()
    assert stderr.count("\n") == 1 and "reconnected" in stderr, stderr


@STOPS
async def test_a_question_open_at_the_drop_reaches_the_editor_once(
    redis_url: str, tmp_path: Path, stop: str
) -> None:
    port = _free_port()
    url = f"ws://127.0.0.1:{port}/acp"
    client = RecordingClient(permission="wait")
    async with asyncio.timeout(TIMEOUT), contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            role_process(
                "agent-host",
                redis_url,
                tmp_path / "host.log",
                env={"ACP_BROKER_CLIENT_REASK_INTERVAL": "0.5"},
            )
        )
        front = await stack.enter_async_context(_front(redis_url, port, tmp_path / "f1.log"))
        conn, _ = await stack.enter_async_context(_bridged(url, tmp_path, client))
        session_id = (await conn.new_session(cwd="/work/asked", mcp_servers=[])).session_id
        turn = asyncio.ensure_future(
            conn.prompt(session_id=session_id, prompt=[text_block("read the file")])
        )
        await wait_for(lambda: len(client.permission_requests) == 1, timeout=20)
        await _stop(front, stop)
        async with _front(redis_url, port, tmp_path / "f2.log"):
            # The editor answers during the outage: the bridge keeps the answer until the
            # broker asks again on the new connection, and answers that ask with it.
            client.release_permission.set()
            reply: Any = await turn
            assert reply.stop_reason == "end_turn"
        assert len(client.permission_requests) == 1
        assert "completed" in [
            getattr(u, "status", None)
            for sid, u in client.updates
            if sid == session_id and u.session_update == "tool_call_update"
        ]
