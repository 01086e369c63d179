"""``acp-broker connect`` end to end: the ``acp`` package's client spawns the bridge as its
agent process and speaks ACP over the bridge's stdio to a real (in-process) broker.

This is how an editor such as Zed uses the broker. The broker runs in the test's event loop,
so everything here is asyncio (``acp.spawn_agent_process``), never a blocking call.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from acp import Client, spawn_agent_process, text_block
from acp.client.connection import ClientSideConnection
from acp.exceptions import RequestError
from acp.schema import ClientCapabilities, FileSystemCapabilities

from broker.store.log import new_session_id

from .support.client import RecordingClient, acp_client, wait_for

MISSING = new_session_id()  # the broker's id shape (a malformed one is -32602), never made

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 30.0
# Only what the bridge needs: no proxy variables, so it dials the broker directly.
ENV = {
    **{key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ},
    "PYTHONPATH": str(ROOT),
}


@asynccontextmanager
async def bridged(
    url: str, tmp_path: Path, *, permission: str = "allow"
) -> AsyncIterator[tuple[ClientSideConnection, RecordingClient, asyncio.subprocess.Process]]:
    """``python -m broker.cli connect URL`` as the agent process of an ``acp`` client."""
    client = RecordingClient(permission=permission)
    with open(tmp_path / "bridge.stderr", "wb") as stderr:  # noqa: ASYNC230 - a local file
        async with spawn_agent_process(
            cast(Client, client),
            sys.executable,
            "-m",
            "broker.cli",
            "connect",
            url,
            env=ENV,
            cwd=ROOT,
            transport_kwargs={"stderr": stderr},
        ) as (conn, process):
            yield conn, client, process


async def _initialize(conn: ClientSideConnection) -> Any:
    caps = ClientCapabilities(
        fs=FileSystemCapabilities(read_text_file=False, write_text_file=False)
    )
    return await conn.initialize(protocol_version=1, client_capabilities=caps)


async def test_a_session_through_the_bridge(url: str, tmp_path: Path) -> None:
    async with asyncio.timeout(TIMEOUT):
        async with bridged(url, tmp_path) as (conn, client, process):
            init = await _initialize(conn)
            assert init.protocol_version == 1
            assert init.agent_info is not None and init.agent_info.name == "acp-broker"
            assert init.agent_capabilities.load_session is True
            assert init.agent_capabilities.session_capabilities.list is not None

            new = await conn.new_session(cwd="/work/bridged", mcp_servers=[])
            session_id = new.session_id
            assert session_id.startswith("sess_")

            reply = await conn.prompt(session_id=session_id, prompt=[text_block("over stdio")])
            assert reply.stop_reason == "end_turn"
            kinds = client.kinds(session_id)
            assert kinds.count("agent_message_chunk") >= 3
            assert client.texts(session_id) == "You said: over stdio"
            assert "tool_call" in kinds and "tool_call_update" in kinds
            # The permission request crossed the bridge to this client and its answer back.
            assert len(client.permission_requests) == 1
            [(asked_for, tool_call, _)] = client.permission_requests
            assert asked_for == session_id and tool_call.status == "pending"
            [update] = [u for sid, u in client.updates if u.session_update == "tool_call_update"]
            assert update.status == "completed"
            assert kinds[-1] == "session_info_update"
            assert {sid for sid, _ in client.updates} == {session_id}

            listed = await conn.list_sessions()
            [info] = [s for s in listed.sessions if s.session_id == session_id]
            assert info.cwd == "/work/bridged" and info.title == "over stdio"
            only_here = await conn.list_sessions(cwd="/work/bridged")
            assert [s.session_id for s in only_here.sessions] == [session_id]

            # Errors cross the bridge as they are.
            with pytest.raises(RequestError) as err:
                await conn.load_session(session_id=MISSING, cwd="/work/x", mcp_servers=[])
            assert err.value.code == -32002
            with pytest.raises(RequestError) as err:
                await conn.list_sessions(cursor="not-a-cursor")
            assert err.value.code == -32602
            assert process.returncode is None
        # stdin EOF: the bridge closes its WebSocket normally and exits 0.
        assert await asyncio.wait_for(process.wait(), 10) == 0
        assert (tmp_path / "bridge.stderr").read_text() == ""


async def test_bridge_and_websocket_clients_share_a_session(url: str, tmp_path: Path) -> None:
    """A window behind the bridge and a direct WebSocket window watch the same session."""
    async with asyncio.timeout(TIMEOUT), bridged(url, tmp_path) as (conn, client, _):
        await _initialize(conn)
        session_id = (await conn.new_session(cwd="/work/shared")).session_id
        await conn.prompt(session_id=session_id, prompt=[text_block("/notool first")])

        direct = await acp_client(url)
        await direct.conn.load_session(session_id=session_id, cwd="/work/shared", mcp_servers=[])
        assert "first" in direct.client.texts(session_id, "user_message_chunk")

        # The direct window prompts; the bridged one sees the user's message and reply live.
        await direct.prompt(session_id, "/notool from the socket")
        await wait_for(
            lambda: "from the socket" in client.texts(session_id, "user_message_chunk"),
            what="the direct client's prompt, through the bridge",
        )
        await wait_for(
            lambda: client.texts(session_id).endswith("You said: /notool from the socket"),
            what="the reply, through the bridge",
        )
        # The bridged window prompts with a tool call: the permission request goes to it,
        # the prompting connection, and not to the direct window.
        await conn.prompt(session_id=session_id, prompt=[text_block("read it")])
        assert len(client.permission_requests) == 1
        assert direct.client.permission_requests == []
        await wait_for(
            lambda: direct.client.texts(session_id).endswith("You said: read it"),
            what="the bridged prompt's reply on the direct client",
        )
        await direct.close()
