"""An ACP agent that shows every kind of update the web console renders, for its tests.

Run it as ``python tests/agents/console_agent.py``. What a prompt does depends on its first
word:

* ``ask``: a pending tool call, then ``session/request_permission`` (Allow / Reject); the
  tool call ends ``completed`` after Allow, ``failed`` otherwise, and the reply names it.
* ``rich``: a thought, a plan, a tool call with a diff, and a Markdown reply (a table, code).
* ``xss``: a reply, a thought and a tool call title full of HTML that must never run:
  ``<script>``, ``<img onerror>``, ``javascript:`` links, inline handlers and styles.
* ``count N``: N chunks ``w1 `` … ``wN ``, then ``done``.
* ``slow N``: N chunks 0.2 s apart (a turn long enough to cancel).
* anything else: ``echo:`` and the prompt in three chunks.

Sessions are resumable (nothing is kept: the broker keeps the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from typing import Any, cast

from acp import (
    PROTOCOL_VERSION,
    plan_entry,
    run_agent,
    start_tool_call,
    text_block,
    tool_content,
    tool_diff_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
)
from acp.interfaces import Agent, Client
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionResumeCapabilities,
    TextContentBlock,
    ToolCallLocation,
    ToolCallStatus,
    ToolCallUpdate,
)

XSS_REPLY = (
    "Hostile output follows.\n\n"
    "<script>window.__xss = 'script'</script>\n\n"
    '<img src="x" onerror="window.__xss = \'img\'">\n\n'
    "[a javascript link](javascript:window.__xss='link')\n\n"
    "<a href=\"javascript:window.__xss='anchor'\">an anchor</a>\n\n"
    '<div onmouseover="window.__xss=\'hover\'" style="position:fixed;inset:0">cover</div>\n\n'
    "<iframe src=\"javascript:window.parent.__xss='frame'\"></iframe>\n\n"
    "[a fine link](https://example.com/) and **bold** text."
)
RICH_REPLY = (
    "## Summary\n\n"
    "The session list is read **page by page**:\n\n"
    "| page | sessions |\n| --- | --- |\n| 1 | 50 |\n| 2 | 50 |\n\n"
    "```python\nasync def pages(client):\n    cursor = None\n```\n"
)
PERMISSION_OPTIONS = [
    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
]


class ConsoleAgent:
    """new, resume and prompt; updates of every kind."""

    _conn: Client

    def __init__(self) -> None:
        self._cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=False,
                session_capabilities=SessionCapabilities(resume=SessionResumeCapabilities()),
            ),
            agent_info=Implementation(name="console-test-agent", version="0.1.0"),
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=f"console_{uuid.uuid4().hex}")

    async def resume_session(self, cwd: str, session_id: str, **kwargs: Any) -> Any:
        return ResumeSessionResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self._cancelled.setdefault(session_id, asyncio.Event()).set()

    async def prompt(self, session_id: str, prompt: Sequence[Any], **kwargs: Any) -> PromptResponse:
        text = "\n".join(block.text for block in prompt if isinstance(block, TextContentBlock))
        cancelled = self._cancelled.setdefault(session_id, asyncio.Event())
        cancelled.clear()
        word, _, rest = text.strip().partition(" ")
        if word == "ask":
            await self._ask(session_id)
        elif word == "rich":
            await self._rich(session_id)
        elif word == "xss":
            await self._xss(session_id)
        elif word in ("count", "slow"):
            for i in range(1, int(rest or "10") + 1):
                if cancelled.is_set():
                    return PromptResponse(stop_reason="cancelled")
                await self._say(session_id, f"w{i} ")
                if word == "slow":
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(cancelled.wait(), 0.2)
            await self._say(session_id, "done")
        else:
            for chunk in ("echo: ", text[: len(text) // 2], text[len(text) // 2 :]):
                await self._say(session_id, chunk)
        return PromptResponse(stop_reason="cancelled" if cancelled.is_set() else "end_turn")

    async def _say(self, session_id: str, text: str) -> None:
        await self._conn.session_update(session_id, update_agent_message_text(text))

    async def _ask(self, session_id: str) -> None:
        call = f"call_{uuid.uuid4().hex[:8]}"
        start = start_tool_call(call, "Write notes.md", kind="edit", status="pending")
        await self._conn.session_update(session_id, start)
        answer = await self._conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id=call, title="Write notes.md", status="pending"),
            options=PERMISSION_OPTIONS,
        )
        outcome = answer.outcome
        allowed = isinstance(outcome, AllowedOutcome) and outcome.option_id == "allow"
        status: ToolCallStatus = "completed" if allowed else "failed"
        await self._conn.session_update(session_id, update_tool_call(call, status=status))
        await self._say(session_id, "allowed" if allowed else "rejected")

    async def _rich(self, session_id: str) -> None:
        await self._conn.session_update(
            session_id, update_agent_thought_text("Reading the list code first.")
        )
        entries = [
            plan_entry("Read the index", status="completed"),
            plan_entry("Page with cursors", status="in_progress"),
            plan_entry("Write the tests"),
        ]
        await self._conn.session_update(session_id, update_plan(entries))
        call = f"call_{uuid.uuid4().hex[:8]}"
        diff = tool_diff_content("/srv/app/list.py", "PAGE = 20\n", old_text="PAGE = 50\n")
        start = start_tool_call(
            call,
            "Edit list.py",
            kind="edit",
            status="in_progress",
            locations=[ToolCallLocation(path="/srv/app/list.py", line=1)],
            content=[diff],
        )
        await self._conn.session_update(session_id, start)
        done = update_tool_call(
            call, status="completed", content=[diff, tool_content(text_block("Saved."))]
        )
        await self._conn.session_update(session_id, done)
        for part in RICH_REPLY.split("\n\n"):
            await self._say(session_id, part + "\n\n")

    async def _xss(self, session_id: str) -> None:
        await self._conn.session_update(
            session_id, update_agent_thought_text("<img src=x onerror=\"window.__xss='thought'\">")
        )
        call = f"call_{uuid.uuid4().hex[:8]}"
        title = "<img src=x onerror=\"window.__xss='tool'\">"
        await self._conn.session_update(
            session_id,
            start_tool_call(
                call, title, status="completed", content=[tool_content(text_block(XSS_REPLY))]
            ),
        )
        half = len(XSS_REPLY) // 2
        for chunk in (XSS_REPLY[:half], XSS_REPLY[half:]):
            await self._say(session_id, chunk)


if __name__ == "__main__":
    asyncio.run(run_agent(cast(Agent, ConsoleAgent())))
