"""A session tool's live view URL, opened in a real browser (Debian's Chromium through
Playwright): the console on that one session, its history and then its turns live; with
authentication on, after a token."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.auth.tokens import TokenStore
from broker.serve import Broker
from broker.store.client import connect

from .conftest import make_settings
from .support.browser import chromium, chromium_missing
from .support.client import tool_result_text

if (missing := chromium_missing()) is not None:
    if os.environ.get("CI"):
        pytest.fail(f"the live view's browser tests cannot run: {missing}", pytrace=False)
    pytest.skip(missing, allow_module_level=True)

from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="module")
WAIT_MS = 15_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    async with chromium() as launched:
        yield launched


async def tool(client: Client, name: str, arguments: dict[str, Any]) -> str:
    result = await client.call_tool(name, arguments)
    text = tool_result_text(result)
    assert not result.is_error, text
    return text


async def test_the_live_view_shows_the_history_then_follows_the_session(
    redis_url: str, browser: Any
) -> None:
    store = connect(redis_url)
    node = Broker(make_settings(), redis=store)
    await node.start()
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        base = f"http://127.0.0.1:{node.http_port}"
        async with Client(f"{base}/mcp") as client:
            created = await tool(
                client, "session_create", {"cwd": "/srv/live", "prompt": "/notool before"}
            )
            session_id = created.split()[0]
            live = created.split("\n")[1].removeprefix("live view: ")
            assert live == f"{base}/sessions/{session_id}"
            page = await context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.goto(live)
            log = page.get_by_role("log", name="Transcript")
            await expect(log).to_contain_text("You said: /notool before", timeout=WAIT_MS)
            await expect(page.locator("#session-cwd")).to_have_text("/srv/live")
            # A turn a tool drives now is seen live in the page.
            reply = await tool(client, "session_prompt", {"id": session_id, "text": "/slow 3"})
            assert reply.endswith("stop reason: end_turn")
            await expect(log).to_contain_text("chunk 1chunk 2chunk 3", timeout=WAIT_MS)
        assert errors == []
    finally:
        await context.close()
        await node.stop()
        await store.aclose()


async def test_with_auth_on_the_live_view_asks_for_a_token_then_shows_the_session(
    redis_url: str, browser: Any
) -> None:
    store = connect(redis_url)
    node = Broker(make_settings(auth="on"), redis=store)
    await node.start()
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        token, _ = await TokenStore(store).create("team-live", ["read", "write"])
        base = f"http://127.0.0.1:{node.http_port}"
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client,
        ):
            created = await tool(
                client, "session_create", {"cwd": "/srv/auth", "prompt": "/notool secret"}
            )
        live = created.split("\n")[1].removeprefix("live view: ")
        page = await context.new_page()
        await page.goto(live)
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=WAIT_MS)
        await page.get_by_label("API token or JWT").fill(token)
        await page.get_by_role("button", name="Sign in").click()
        log = page.get_by_role("log", name="Transcript")
        await expect(log).to_contain_text("You said: /notool secret", timeout=WAIT_MS)
    finally:
        await context.close()
        await node.stop()
        await store.aclose()


async def test_a_question_no_window_could_answer_waits_for_the_live_view(
    redis_url: str, browser: Any
) -> None:
    store = connect(redis_url)
    node = Broker(make_settings(client_reask_interval=0.5), redis=store)
    await node.start()
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        base = f"http://127.0.0.1:{node.http_port}"
        async with Client(f"{base}/mcp") as client:
            created = await tool(client, "session_create", {"cwd": "/srv/ask"})
            session_id = created.split()[0]
            # No window has the session open: the turn waits for a person, and says where.
            waiting = await tool(client, "session_prompt", {"id": session_id, "text": "look"})
            live = f"{base}/sessions/{session_id}"
            assert f"live view: {live}" in waiting and waiting.endswith("still running")
            page = await context.new_page()
            await page.goto(live)
            allow = page.get_by_role("button", name="Allow")
            await expect(allow).to_be_visible(timeout=WAIT_MS)
            await allow.click()
            await expect(page.locator("#session-state")).to_have_text("idle", timeout=WAIT_MS)
            listed = await tool(client, "session_cancel", {"id": session_id})
            assert listed == "no turn was running"  # it ended once the person answered
    finally:
        await context.close()
        await node.stop()
        await store.aclose()
