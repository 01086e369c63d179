"""The demo agent and the plain test agent, driven as real subprocesses over ACP stdio."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from asyncio.subprocess import Process
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from acp import PROTOCOL_VERSION, Client, spawn_agent_process, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    AvailableCommandsUpdate,
    CurrentModeUpdate,
    DeniedOutcome,
    RequestPermissionResponse,
    SessionInfoUpdate,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)

from broker.config import AgentSpec

REPO = Path(__file__).resolve().parents[1]
DEMO = ("-m", "broker.demo.agent")
PLAIN = (str(REPO / "tests" / "agents" / "plain_agent.py"),)
TIMEOUT = 5.0
# Starting Python and importing acp (its pydantic schema) alone takes about a second.
STARTUP_TIMEOUT = 20.0
# /slow 20 would take 4 s; a cancelled turn must end well before that.
CANCEL_TIMEOUT = 2.0


class RecordingClient:
    """An ACP client that records session updates and answers permission requests.

    ``decision`` is the optionId to select, ``"cancelled"`` to answer with the cancelled
    outcome, or ``None`` to leave the request unanswered until the agent gives up on it.
    """

    def __init__(self, decision: str | None = "allow_once") -> None:
        self.decision = decision
        self.updates: list[tuple[str, Any]] = []
        self.permission_requests: list[Any] = []
        self._changed = asyncio.Condition()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        async with self._changed:
            self._changed.notify_all()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permission_requests.append((session_id, tool_call, options))
        async with self._changed:
            self._changed.notify_all()
        if self.decision is None:
            await asyncio.get_running_loop().create_future()
        if self.decision == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        assert self.decision is not None
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=self.decision)
        )

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), TIMEOUT)

    def of_type(self, kind: type, session_id: str | None = None) -> list[Any]:
        return [
            update
            for sid, update in self.updates
            if isinstance(update, kind) and session_id in (None, sid)
        ]

    def text(self, session_id: str) -> str:
        chunks = self.of_type(AgentMessageChunk, session_id)
        return "".join(chunk.content.text for chunk in chunks)


def spawn(
    client: RecordingClient, *script: str, env: dict[str, str] | None = None
) -> contextlib.AbstractAsyncContextManager[tuple[ClientSideConnection, Process]]:
    """Spawn an agent script with this repository as its working directory."""
    return spawn_agent_process(cast(Client, client), sys.executable, *script, env=env, cwd=REPO)


@contextlib.asynccontextmanager
async def running(
    client: RecordingClient, *script: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[ClientSideConnection, Process]]:
    """Spawn an agent script, initialize it, and yield (connection, process)."""
    async with spawn(client, *script, env=env) as (conn, process):
        await asyncio.wait_for(conn.initialize(protocol_version=PROTOCOL_VERSION), STARTUP_TIMEOUT)
        yield conn, process


async def new_session(conn: ClientSideConnection, cwd: Path = REPO) -> str:
    response = await asyncio.wait_for(conn.new_session(cwd=str(cwd)), TIMEOUT)
    return response.session_id


async def prompt(conn: ClientSideConnection, session_id: str, text: str) -> str:
    response = await asyncio.wait_for(conn.prompt(session_id, [text_block(text)]), TIMEOUT)
    return response.stop_reason


TEST_ENV = {"ACP_DEMO_TEST_COMMANDS": "1", "ACP_DEMO_CHUNK_DELAY": "0.001"}


async def test_initialize_advertises_capabilities() -> None:
    client = RecordingClient()
    async with spawn(client, *DEMO) as (conn, _):
        response = await asyncio.wait_for(conn.initialize(protocol_version=1), STARTUP_TIMEOUT)
    assert response.protocol_version == 1
    capabilities = response.agent_capabilities
    assert capabilities is not None and capabilities.load_session is True
    assert capabilities.session_capabilities is not None
    assert capabilities.session_capabilities.resume is not None
    assert capabilities.session_capabilities.close is not None
    assert response.agent_info is not None
    assert (response.agent_info.name, response.agent_info.version) == ("acp-broker-demo", "0.1.0")
    assert response.agent_info.title


async def test_the_configured_command_acp_broker_demo_agent_runs_without_a_venv_on_path() -> None:
    """``acp-broker demo-agent`` as an agent command runs this installation's broker, so it
    starts even where PATH holds no ``acp-broker`` (a virtual environment not activated)."""
    spec = AgentSpec.parse("demo=acp-broker demo-agent")
    assert spec.command[:3] == [sys.executable, "-m", "broker.cli"]
    client = RecordingClient()
    env = {"PATH": "/nonexistent", **TEST_ENV}
    async with running(client, *spec.command[1:], env=env) as (conn, _):
        session_id = await new_session(conn)
        assert await prompt(conn, session_id, "hello") == "end_turn"
    assert "hello" in client.text(session_id).lower()


async def test_new_session_returns_modes_config_and_commands() -> None:
    client = RecordingClient()
    async with running(client, *DEMO) as (conn, _):
        response = await asyncio.wait_for(conn.new_session(cwd=str(REPO)), TIMEOUT)
        assert response.session_id.startswith("demo_")
        assert response.modes is not None and response.modes.current_mode_id == "ask"
        assert {mode.id for mode in response.modes.available_modes} == {"ask", "code"}
        assert response.config_options is not None
        [style] = response.config_options
        assert (style.id, style.current_value) == ("style", "plain")
        await client.wait_for(lambda: bool(client.of_type(AvailableCommandsUpdate)))


async def test_prompt_streams_chunks_tool_call_and_allowed_permission() -> None:
    client = RecordingClient(decision="allow_once")
    async with running(client, *DEMO) as (conn, _):
        session_id = await new_session(conn)
        assert await prompt(conn, session_id, "hello brave new world") == "end_turn"
    assert client.text(session_id) == "You said: hello brave new world"
    assert len(client.of_type(AgentMessageChunk)) >= 4
    [start] = client.of_type(ToolCallStart)
    assert (start.kind, start.status) == ("read", "pending")
    [(_, tool_call, options)] = client.permission_requests
    assert tool_call.tool_call_id == start.tool_call_id
    assert {(o.option_id, o.kind, o.name) for o in options} == {
        ("allow_once", "allow_once", "Allow"),
        ("reject_once", "reject_once", "Reject"),
    }
    [done] = client.of_type(ToolCallProgress)
    assert (done.tool_call_id, done.status) == (start.tool_call_id, "completed")
    assert done.content and done.content[0].content.text


async def test_rejected_permission_fails_the_tool_call() -> None:
    client = RecordingClient(decision="reject_once")
    async with running(client, *DEMO) as (conn, _):
        session_id = await new_session(conn)
        assert await prompt(conn, session_id, "please do not") == "end_turn"
    [done] = client.of_type(ToolCallProgress)
    assert done.status == "failed"


async def test_cancelled_permission_outcome_ends_turn_as_cancelled() -> None:
    client = RecordingClient(decision="cancelled")
    async with running(client, *DEMO) as (conn, _):
        session_id = await new_session(conn)
        assert await prompt(conn, session_id, "never mind") == "cancelled"
    assert client.of_type(ToolCallProgress) == []


async def test_session_info_update_after_first_prompt_only() -> None:
    client = RecordingClient()
    async with running(client, *DEMO) as (conn, _):
        session_id = await new_session(conn)
        await prompt(conn, session_id, "Plan the\nbroker  rollout for next week, please, in detail")
        [info] = client.of_type(SessionInfoUpdate, session_id)
        await prompt(conn, session_id, "and another thing")
    assert client.of_type(SessionInfoUpdate, session_id) == [info]
    assert info.title.startswith("Plan the broker rollout for next")
    assert "\n" not in info.title and len(info.title) <= 40


async def test_cancel_during_slow_stream_returns_cancelled_quickly() -> None:
    client = RecordingClient()
    async with running(client, *DEMO, env=TEST_ENV) as (conn, _):
        session_id = await new_session(conn)
        turn = asyncio.ensure_future(conn.prompt(session_id, [text_block("/slow 20")]))
        await client.wait_for(lambda: len(client.of_type(AgentMessageChunk)) >= 2)
        started = time.monotonic()
        await conn.cancel(session_id)
        response = await asyncio.wait_for(turn, CANCEL_TIMEOUT)
        assert response.stop_reason == "cancelled"
        assert time.monotonic() - started < CANCEL_TIMEOUT
    assert len(client.of_type(AgentMessageChunk)) < 20
    assert client.of_type(ToolCallStart) == []


async def test_cancel_while_waiting_for_permission() -> None:
    client = RecordingClient(decision=None)
    async with running(client, *DEMO, env=TEST_ENV) as (conn, _):
        session_id = await new_session(conn)
        turn = asyncio.ensure_future(conn.prompt(session_id, [text_block("hi")]))
        await client.wait_for(lambda: bool(client.permission_requests))
        await conn.cancel(session_id)
        response = await asyncio.wait_for(turn, CANCEL_TIMEOUT)
    assert response.stop_reason == "cancelled"


async def test_test_commands_chunks_and_notool() -> None:
    client = RecordingClient()
    async with running(client, *DEMO, env=TEST_ENV) as (conn, _):
        session_id = await new_session(conn)
        assert await prompt(conn, session_id, "/chunks 50") == "end_turn"
        chunks = [chunk.content.text for chunk in client.of_type(AgentMessageChunk)]
        assert chunks == [f"chunk {i}" for i in range(1, 51)]
        assert await prompt(conn, session_id, "/notool hi") == "end_turn"
    assert client.text(session_id).endswith("You said: /notool hi")
    assert client.permission_requests == [] and client.of_type(ToolCallStart) == []


async def test_garbage_line_is_skipped_and_turn_completes() -> None:
    client = RecordingClient()
    async with running(client, *DEMO, env=TEST_ENV) as (conn, _):
        session_id = await new_session(conn)
        assert await prompt(conn, session_id, "/garbage") == "end_turn"
    assert client.text(session_id) == "You said: /garbage"


async def test_crash_exits_with_status_3() -> None:
    client = RecordingClient()
    async with running(client, *DEMO, env=TEST_ENV) as (conn, process):
        session_id = await new_session(conn)
        with pytest.raises(ConnectionError):
            await prompt(conn, session_id, "/crash")
        assert await asyncio.wait_for(process.wait(), TIMEOUT) == 3


async def test_test_commands_are_plain_text_without_env() -> None:
    client = RecordingClient()
    async with running(client, *DEMO, env={"ACP_DEMO_CHUNK_DELAY": "0"}) as (conn, _):
        session_id = await new_session(conn)
        assert await prompt(conn, session_id, "/crash") == "end_turn"
    assert client.text(session_id) == "You said: /crash"


async def test_modes_and_config_options() -> None:
    client = RecordingClient()
    async with running(client, *DEMO, env=TEST_ENV) as (conn, _):
        session_id = await new_session(conn)
        await asyncio.wait_for(
            conn.set_session_mode(session_id=session_id, mode_id="code"), TIMEOUT
        )
        [mode] = client.of_type(CurrentModeUpdate)
        assert mode.current_mode_id == "code"
        response = await asyncio.wait_for(
            conn.set_config_option(config_id="style", session_id=session_id, value="shouty"),
            TIMEOUT,
        )
        assert [option.current_value for option in response.config_options] == ["shouty"]
        await prompt(conn, session_id, "/notool quiet")
    assert client.text(session_id) == "YOU SAID: /NOTOOL QUIET"


async def test_load_after_restart_replays_history(tmp_path: Path) -> None:
    env = {**TEST_ENV, "ACP_DEMO_STATE_DIR": str(tmp_path)}
    async with running(RecordingClient(), *DEMO, env=env) as (conn, _):
        session_id = await new_session(conn)
        await prompt(conn, session_id, "remember me")
    client = RecordingClient()
    async with running(client, *DEMO, env=env) as (conn, _):
        response = await asyncio.wait_for(conn.load_session(str(REPO), session_id), TIMEOUT)
        await client.wait_for(lambda: len(client.updates) >= 2)
        assert response.modes is not None
        user, agent = (update for _, update in client.updates)
        assert isinstance(user, UserMessageChunk) and user.content.text == "remember me"
        assert isinstance(agent, AgentMessageChunk)
        assert agent.content.text == "You said: remember me"
        assert await prompt(conn, session_id, "again") == "end_turn"
    assert client.of_type(SessionInfoUpdate) == []


async def test_unknown_load_resume_and_close() -> None:
    client = RecordingClient()
    async with running(client, *DEMO, env=TEST_ENV) as (conn, _):
        await asyncio.wait_for(conn.load_session(str(REPO), "from_elsewhere"), TIMEOUT)
        assert client.updates == []
        session_id = await new_session(conn)
        await asyncio.wait_for(conn.resume_session(session_id=session_id, cwd=str(REPO)), TIMEOUT)
        turn = asyncio.ensure_future(conn.prompt(session_id, [text_block("/slow 20")]))
        await client.wait_for(lambda: bool(client.of_type(AgentMessageChunk, session_id)))
        await asyncio.wait_for(conn.close_session(session_id=session_id), TIMEOUT)
        assert (await asyncio.wait_for(turn, CANCEL_TIMEOUT)).stop_reason == "cancelled"


async def test_plain_agent_is_minimal() -> None:
    client = RecordingClient()
    async with spawn(client, *PLAIN) as (conn, _):
        response = await asyncio.wait_for(conn.initialize(protocol_version=1), STARTUP_TIMEOUT)
        capabilities = response.agent_capabilities
        assert capabilities is not None and capabilities.load_session is False
        session_caps = capabilities.session_capabilities
        assert session_caps is None or (session_caps.resume is None and session_caps.close is None)
        session_id = await new_session(conn)
        assert session_id.startswith("plain_")
        assert await prompt(conn, session_id, "ping") == "end_turn"
    assert [c.content.text for c in client.of_type(AgentMessageChunk)] == ["plain:", "ping"]
