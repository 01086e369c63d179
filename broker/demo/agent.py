"""A small, key-free ACP v1 agent that ``acp-broker serve`` runs by default.

It speaks real ACP over stdio (built on ``acp.run_agent``) and exercises the parts of the
protocol a broker has to carry: streamed message chunks, a tool call guarded by
``session/request_permission``, cancellation, modes, a select config option, session titles
(``session_info_update``), and ``session/load`` / ``session/resume`` / ``session/close``.

Run it with ``python -m broker.demo.agent``. Environment variables:

* ``ACP_DEMO_CHUNK_DELAY`` -- seconds between reply chunks (default ``0.02``).
* ``ACP_DEMO_STATE_DIR`` -- folder for one JSON file per session, so a fresh process can
  ``session/load`` a session from before a restart. Unset: history lives in memory only.
* ``ACP_DEMO_TEST_COMMANDS=1`` -- prompts starting with ``/chunks N``, ``/slow N``,
  ``/notool``, ``/crash``, ``/hang`` or ``/garbage`` trigger test behaviour (see
  ``TEST_COMMANDS``). Without it they are ordinary text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from acp import (
    PROTOCOL_VERSION,
    RequestError,
    run_agent,
    start_read_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_tool_call,
    update_user_message_text,
)
from acp.helpers import update_available_commands, update_current_mode
from acp.interfaces import Agent, Client
from acp.schema import (
    AgentCapabilities,
    AgentMessageChunk,
    AllowedOutcome,
    AudioContentBlock,
    AvailableCommand,
    CloseSessionResponse,
    EmbeddedResourceContentBlock,
    ForkSessionResponse,
    ImageContentBlock,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionConfigOptionBoolean,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionForkCapabilities,
    SessionInfoUpdate,
    SessionMode,
    SessionModeState,
    SessionResumeCapabilities,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    StopReason,
    TextContentBlock,
    ToolCallProgress,
    ToolCallUpdate,
    UserMessageChunk,
)

ContentBlock = (
    TextContentBlock
    | ImageContentBlock
    | AudioContentBlock
    | ResourceContentBlock
    | EmbeddedResourceContentBlock
)

AGENT_INFO = Implementation(name="acp-broker-demo", title="ACP Broker Demo Agent", version="0.1.0")

MODES = (
    SessionMode(id="ask", name="Ask", description="Answer questions; tools need permission."),
    SessionMode(id="code", name="Code", description="Pretend to work on code."),
)
DEFAULT_MODE = "ask"

STYLE_OPTION_ID = "style"
STYLES = {"plain": "Plain", "shouty": "Shouty (upper case)"}
DEFAULT_STYLE = "plain"

ALLOW_OPTION_ID = "allow_once"
PERMISSION_OPTIONS = (
    PermissionOption(option_id=ALLOW_OPTION_ID, name="Allow", kind="allow_once"),
    PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
)

TEST_COMMANDS = (
    AvailableCommand(name="chunks", description="/chunks N: N 'chunk i' chunks, no delay, no tool"),
    AvailableCommand(name="slow", description="/slow N: N chunks 0.2 s apart, no tool"),
    AvailableCommand(name="notool", description="Reply without a tool call"),
    AvailableCommand(name="crash", description="Exit the agent process with status 3"),
    AvailableCommand(name="hang", description="Never answer, ignore cancel"),
    AvailableCommand(name="garbage", description="Write a non-JSON line to stdout, then reply"),
)
_TEST_COMMAND = re.compile(
    r"/(?:(?P<counted>chunks|slow)\s+(?P<count>\d+)|(?P<bare>notool|crash|hang|garbage))\b"
)
MAX_CHUNKS = 100_000
SLOW_DELAY = 0.2
TITLE_LENGTH = 40
_SAFE_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True)
class DemoConfig:
    """Behaviour switches, read from the environment."""

    chunk_delay: float = 0.02
    state_dir: Path | None = None
    test_commands: bool = False

    @classmethod
    def from_env(cls) -> DemoConfig:
        state_dir = os.environ.get("ACP_DEMO_STATE_DIR")
        return cls(
            chunk_delay=float(os.environ.get("ACP_DEMO_CHUNK_DELAY", "0.02")),
            state_dir=Path(state_dir) if state_dir else None,
            test_commands=os.environ.get("ACP_DEMO_TEST_COMMANDS") == "1",
        )


@dataclass
class DemoSession:
    """One session's state. ``history`` holds ``{"role": "user"|"agent", "text": ...}``."""

    session_id: str
    cwd: str
    mode: str = DEFAULT_MODE
    style: str = DEFAULT_STYLE
    titled: bool = False
    history: list[dict[str, str]] = field(default_factory=list)
    cancel: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "cwd": self.cwd,
            "mode": self.mode,
            "style": self.style,
            "titled": self.titled,
            "history": self.history,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DemoSession:
        return cls(
            session_id=data["sessionId"],
            cwd=data["cwd"],
            mode=data.get("mode", DEFAULT_MODE),
            style=data.get("style", DEFAULT_STYLE),
            titled=data.get("titled", True),
            history=list(data.get("history", [])),
        )


class SessionStore:
    """Sessions in memory, mirrored to ``<state_dir>/<session id>.json`` when configured."""

    def __init__(self, state_dir: Path | None) -> None:
        self._state_dir = state_dir
        self._live: dict[str, DemoSession] = {}

    def find(self, session_id: str) -> DemoSession | None:
        return self._live.get(session_id)

    def get(self, session_id: str) -> DemoSession:
        session = self._live.get(session_id)
        if session is None:
            raise RequestError.invalid_params(
                {"sessionId": session_id, "reason": "unknown session"}
            )
        return session

    def add(self, session: DemoSession) -> None:
        self._live[session.session_id] = session
        self.save(session)

    def restore(self, session_id: str, cwd: str) -> DemoSession:
        """Return the live session, else the saved one, else an empty one that gets no title."""
        session = self._live.get(session_id) or self._read(session_id)
        if session is None:
            session = DemoSession(session_id=session_id, cwd=cwd, titled=True)
        session.cwd = cwd
        self._live[session_id] = session
        return session

    def forget(self, session_id: str) -> DemoSession | None:
        return self._live.pop(session_id, None)

    def save(self, session: DemoSession) -> None:
        path = self._path(session.session_id)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(session.to_json()), encoding="utf-8")
        tmp.replace(path)

    def _read(self, session_id: str) -> DemoSession | None:
        path = self._path(session_id)
        if path is None or not path.is_file():
            return None
        return DemoSession.from_json(json.loads(path.read_text(encoding="utf-8")))

    def _path(self, session_id: str) -> Path | None:
        if self._state_dir is None or not _SAFE_SESSION_ID.fullmatch(session_id):
            return None
        return self._state_dir / f"{session_id}.json"


class Turn:
    """One prompt turn: streams agent text to the client and remembers what was said."""

    def __init__(self, conn: Client, session: DemoSession) -> None:
        self._conn = conn
        self.session = session
        self.parts: list[str] = []

    async def say(self, text: str) -> None:
        await self._conn.session_update(self.session.session_id, update_agent_message_text(text))
        self.parts.append(text)

    async def stream(self, chunks: Iterable[str], delay: float) -> StopReason:
        """Send ``chunks`` with ``delay`` seconds between them, stopping early on cancel."""
        for index, chunk in enumerate(chunks):
            if await self.cancelled_within(delay if index else 0.0):
                return "cancelled"
            await self.say(chunk)
        return "end_turn"

    async def cancelled_within(self, seconds: float) -> bool:
        """Wait up to ``seconds``; return True as soon as the session is cancelled."""
        cancel = self.session.cancel
        if seconds > 0 and not cancel.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cancel.wait(), seconds)
        return cancel.is_set()


class DemoAgent:
    """The ACP agent. Pass an instance to ``acp.run_agent``."""

    _conn: Client

    def __init__(self, config: DemoConfig | None = None) -> None:
        self._config = config or DemoConfig.from_env()
        self._sessions = SessionStore(self._config.state_dir)
        self._background: set[asyncio.Task[None]] = set()

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        capabilities = AgentCapabilities(
            load_session=True,
            # It reads no prompt content but text, and runs no MCP server of any
            # transport: it takes these (and says what it got), so it claims them.
            prompt_capabilities=PromptCapabilities(image=True, embedded_context=True),
            mcp_capabilities=McpCapabilities(http=True),
            session_capabilities=SessionCapabilities(
                resume=SessionResumeCapabilities(),
                close=SessionCloseCapabilities(),
                fork=SessionForkCapabilities(),
            ),
        )
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=capabilities,
            agent_info=AGENT_INFO,
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        session = DemoSession(session_id=f"demo_{uuid.uuid4().hex}", cwd=cwd)
        self._sessions.add(session)
        # Scheduled, not awaited: the task first runs once this handler has queued its response.
        self._spawn(self._announce_commands(session.session_id))
        return NewSessionResponse(
            session_id=session.session_id,
            modes=_mode_state(session),
            config_options=_config_options(session),
        )

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        session = self._sessions.restore(session_id, cwd)
        for entry in session.history:
            await self._conn.session_update(session_id, replay_update(entry))
        return LoadSessionResponse(
            modes=_mode_state(session), config_options=_config_options(session)
        )

    async def resume_session(
        self, session_id: str, cwd: str, **kwargs: Any
    ) -> ResumeSessionResponse:
        session = self._sessions.restore(session_id, cwd)
        return ResumeSessionResponse(
            modes=_mode_state(session), config_options=_config_options(session)
        )

    async def fork_session(self, session_id: str, cwd: str, **kwargs: Any) -> ForkSessionResponse:
        """A new session that starts with a copy of this one's history (unstable ACP)."""
        parent = self._sessions.restore(session_id, cwd)
        child = DemoSession(
            session_id=f"demo_{uuid.uuid4().hex}",
            cwd=cwd,
            mode=parent.mode,
            style=parent.style,
            titled=parent.titled,
            history=list(parent.history),
        )
        self._sessions.add(child)
        return ForkSessionResponse(
            session_id=child.session_id,
            modes=_mode_state(child),
            config_options=_config_options(child),
        )

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        session = self._sessions.forget(session_id)
        if session is not None:
            session.cancel.set()
        return CloseSessionResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self._sessions.find(session_id)
        if session is not None:
            session.cancel.set()

    async def set_session_mode(
        self, session_id: str, mode_id: str, **kwargs: Any
    ) -> SetSessionModeResponse:
        session = self._sessions.get(session_id)
        if mode_id not in {mode.id for mode in MODES}:
            raise RequestError.invalid_params({"modeId": mode_id, "reason": "unknown mode"})
        session.mode = mode_id
        self._sessions.save(session)
        await self._conn.session_update(session_id, update_current_mode(mode_id))
        return SetSessionModeResponse()

    async def set_config_option(
        self, config_id: str, session_id: str, value: str | bool, **kwargs: Any
    ) -> SetSessionConfigOptionResponse:
        session = self._sessions.get(session_id)
        if config_id != STYLE_OPTION_ID or not isinstance(value, str) or value not in STYLES:
            raise RequestError.invalid_params({"configId": config_id, "value": value})
        session.style = value
        self._sessions.save(session)
        return SetSessionConfigOptionResponse(config_options=_config_options(session))

    async def prompt(
        self, session_id: str, prompt: Sequence[ContentBlock], **kwargs: Any
    ) -> PromptResponse:
        session = self._sessions.get(session_id)
        session.cancel.clear()
        text = prompt_text(prompt)
        turn = Turn(self._conn, session)
        stop_reason = await self._play(turn, text)
        await self._finish(turn, text)
        return PromptResponse(stop_reason=stop_reason)

    async def _play(self, turn: Turn, text: str) -> StopReason:
        name, count = self._test_command(text)
        if name == "crash":
            os._exit(3)
        if name == "hang":
            await asyncio.get_running_loop().create_future()
        if name in ("chunks", "slow"):
            numbered = (f"chunk {i}" for i in range(1, min(count, MAX_CHUNKS) + 1))
            return await turn.stream(numbered, SLOW_DELAY if name == "slow" else 0.0)
        if name == "garbage":
            os.write(1, b"this is not json\n")
        chunks = reply_chunks(text, turn.session.style)
        stop_reason = await turn.stream(chunks, self._config.chunk_delay)
        if stop_reason == "cancelled" or name == "notool":
            return stop_reason
        return await self._use_tool(turn)

    async def _use_tool(self, turn: Turn) -> StopReason:
        """Report a pretend file read, ask permission for it and report how it went."""
        session = turn.session
        if session.cancel.is_set():
            return "cancelled"
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        path = str(Path(session.cwd) / "README.md")
        title = "Read README.md"
        start = start_read_tool_call(call_id, title, path)
        await self._conn.session_update(session.session_id, start)
        pending = ToolCallUpdate(
            tool_call_id=call_id,
            title=title,
            kind="read",
            status="pending",
            locations=start.locations,
        )
        allowed = await self._ask_permission(turn, pending)
        if allowed is None:
            return "cancelled"
        await self._conn.session_update(session.session_id, tool_result(call_id, path, allowed))
        return "end_turn"

    async def _ask_permission(self, turn: Turn, tool_call: ToolCallUpdate) -> bool | None:
        """True if allowed, False if rejected, None if the turn was cancelled meanwhile."""
        request = asyncio.ensure_future(
            self._conn.request_permission(
                session_id=turn.session.session_id,
                tool_call=tool_call,
                options=list(PERMISSION_OPTIONS),
            )
        )
        cancelled = asyncio.ensure_future(turn.session.cancel.wait())
        done, _ = await asyncio.wait({request, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        cancelled.cancel()
        if request not in done:
            request.cancel()
            return None
        outcome = request.result().outcome
        if not isinstance(outcome, AllowedOutcome):
            return None
        return outcome.option_id == ALLOW_OPTION_ID

    async def _finish(self, turn: Turn, text: str) -> None:
        """Record the turn in the history and title the session after its first prompt."""
        session = turn.session
        session.history.append({"role": "user", "text": text})
        if turn.parts:
            session.history.append({"role": "agent", "text": "".join(turn.parts)})
        if not session.titled:
            session.titled = True
            title = SessionInfoUpdate(session_update="session_info_update", title=title_for(text))
            await self._conn.session_update(session.session_id, title)
        self._sessions.save(session)

    async def _announce_commands(self, session_id: str) -> None:
        commands = TEST_COMMANDS if self._config.test_commands else ()
        await self._conn.session_update(session_id, update_available_commands(commands))

    def _test_command(self, text: str) -> tuple[str, int]:
        """Return ``(name, count)`` of a test command, or ``("", 0)`` for ordinary text."""
        match = _TEST_COMMAND.match(text.strip()) if self._config.test_commands else None
        if match is None:
            return "", 0
        if match["bare"]:
            return match["bare"], 0
        return match["counted"], int(match["count"])

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def prompt_text(prompt: Sequence[ContentBlock]) -> str:
    """The text of a prompt's text blocks, joined by newlines."""
    return "\n".join(block.text for block in prompt if isinstance(block, TextContentBlock))


def reply_chunks(text: str, style: str) -> list[str]:
    """The demo reply split into word-sized chunks that concatenate back to the reply."""
    reply = f"You said: {text}"
    if style == "shouty":
        reply = reply.upper()
    return re.findall(r"\S+\s*", reply)


def replay_update(entry: dict[str, str]) -> UserMessageChunk | AgentMessageChunk:
    """The ``session/update`` that replays one history entry on ``session/load``."""
    if entry["role"] == "user":
        return update_user_message_text(entry["text"])
    return update_agent_message_text(entry["text"])


def tool_result(call_id: str, path: str, allowed: bool) -> ToolCallProgress:
    """The final ``tool_call_update`` of the pretend read: completed if allowed, else failed."""
    if allowed:
        note = f"Pretended to read {path} (the demo agent reads nothing)."
        return update_tool_call(
            call_id, status="completed", content=[tool_content(text_block(note))]
        )
    note = "Permission was refused; nothing was read."
    return update_tool_call(call_id, status="failed", content=[tool_content(text_block(note))])


def title_for(text: str) -> str:
    """A one-line session title from the first prompt."""
    line = " ".join(text.split())
    if len(line) <= TITLE_LENGTH:
        return line or "Demo session"
    return line[: TITLE_LENGTH - 1].rstrip() + "…"


def _mode_state(session: DemoSession) -> SessionModeState:
    return SessionModeState(current_mode_id=session.mode, available_modes=list(MODES))


def _config_options(
    session: DemoSession,
) -> list[SessionConfigOptionSelect | SessionConfigOptionBoolean]:
    values = [SessionConfigSelectOption(value=value, name=name) for value, name in STYLES.items()]
    style = SessionConfigOptionSelect(
        id=STYLE_OPTION_ID,
        name="Reply style",
        type="select",
        current_value=session.style,
        options=values,
    )
    return [style]


def main() -> None:
    """Serve the demo agent on stdin/stdout until the client goes away."""
    logging.basicConfig(level=logging.WARNING)
    # acp routes by attribute lookup, so DemoAgent implements only what it supports and is
    # not a complete structural ``Agent``. acp 0.12 routes session/resume and session/close
    # only with the unstable flag, although both are stable ACP v1 methods.
    agent = cast(Agent, DemoAgent())
    asyncio.run(run_agent(agent, use_unstable_protocol=True))


if __name__ == "__main__":
    main()
