"""The web console in a real browser: Debian's Chromium driven by Playwright.

The pages talk to real brokers (in this process on a private redis-server, or as
processes behind a loopback load balancer) over the same ``/acp`` WebSocket as every
client. One browser serves the whole module; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import pytest_asyncio

from broker.auth.tokens import TokenStore
from broker.config import AgentSpec
from broker.protocol.capabilities import LIST_CHANGED_METHOD
from broker.serve import Broker
from broker.store.client import connect

from .conftest import AGENTS, ROOT, demo_agent, make_settings
from .support.balancer import Backend, balancer
from .support.broker_process import broker_process
from .support.browser import chromium, chromium_missing
from .support.client import RawClient
from .support.redis_server import redis_server
from .support.roles import role_process
from .support.seed import BASE_MS, seed_many
from .support.wire import CheckedClient

if (missing := chromium_missing()) is not None:
    if os.environ.get("CI"):  # .ci/run installs both: there, a skip would hide a failure
        pytest.fail(f"the console's browser tests cannot run: {missing}", pytrace=False)
    pytest.skip(missing, allow_module_level=True)

from playwright.async_api import BrowserContext, Page, expect

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT_MS = 15_000
LIST_PUSH_MS = 5_000
"""How long a change made elsewhere may take to show in a list (the fallback poll: 30 s)."""
SCREENSHOT = ROOT / "docs" / "console.png"
"""Where the rich-session test leaves its screenshot for docs/console.md when
``UPDATE_SCREENSHOT=1`` (otherwise in the test's own folder: a test run changes no file of
the tree)."""
CONSOLE_AGENT = [sys.executable, str(AGENTS / "console_agent.py")]


def console_agent(name: str = "console") -> AgentSpec:
    return AgentSpec(name=name, command=CONSOLE_AGENT, kind="combined")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Any]:
    async with chromium() as launched:
        yield launched


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(redis_url_session: str) -> AsyncIterator[Broker]:
    """One broker (front, agent host, projector) for the module, on a private Redis."""
    store = connect(redis_url_session)
    broker = Broker(make_settings(agents=[console_agent(), demo_agent()]), redis=store)
    await broker.start()
    yield broker
    await broker.stop()
    await store.aclose()


@pytest_asyncio.fixture(loop_scope="module")
async def context(browser: Any) -> AsyncIterator[Any]:
    """A fresh browser profile (its own tab storage) for a test."""
    made = await browser.new_context(viewport={"width": 1280, "height": 800})
    yield made
    await made.close()


@contextlib.asynccontextmanager
async def _own_broker(store: Any, browser: Any, settings: Any) -> AsyncIterator[tuple[Broker, Any]]:
    """A broker of a test's own on ``store`` and a fresh browser context; both closed after,
    and ``store`` with them."""
    broker = Broker(settings, redis=store)
    await broker.start()
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        yield broker, context
    finally:
        await context.close()
        await broker.stop()
        await store.aclose()


def console_url(broker: Broker) -> str:
    return f"http://127.0.0.1:{broker.http_port}/"


_PAGE_ERRORS: weakref.WeakKeyDictionary[Page, list[str]] = weakref.WeakKeyDictionary()


def page_errors(page: Page) -> list[str]:
    """The script errors ``page`` has thrown since ``open_console`` opened it."""
    return _PAGE_ERRORS[page]


async def open_console(context: BrowserContext, url: str) -> Page:
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    _PAGE_ERRORS[page] = errors
    await page.goto(url)
    await expect(page.get_by_role("status")).to_have_text("Online", timeout=WAIT_MS)
    return page


async def new_session(page: Page, agent: str = "console", cwd: str = "/srv/console") -> str:
    await page.get_by_label("Agent").select_option(agent)
    await page.get_by_label("Working directory", exact=True).fill(cwd)
    await page.get_by_role("button", name="New session").click()
    await expect(page).to_have_url(re.compile(r"#session=sess_"), timeout=WAIT_MS)
    return session_of(page.url)


def session_of(url: str) -> str:
    """The session id in a console address (``…#session=ID&cwd=…``)."""
    return parse_qs(urlsplit(url).fragment)["session"][0]


async def two_pages_on_a_new_session(context: BrowserContext, node: Broker) -> tuple[Page, Page]:
    """A page that made a session, and a second page opened on that session."""
    a = await open_console(context, console_url(node))
    session_id = await new_session(a)
    b = await open_console(context, f"{console_url(node)}#session={session_id}")
    await expect(b.locator("#session-cwd")).to_have_text("/srv/console", timeout=WAIT_MS)
    return a, b


async def rename(page: Page, title: str) -> None:
    """Retitles the page's open session through its Rename form."""
    await page.get_by_role("button", name="Rename").click()
    await page.get_by_role("textbox", name="Title").fill(title)
    await page.get_by_role("button", name="Save title").click()


async def prompt(page: Page, text: str) -> None:
    box = page.get_by_role("textbox", name="Prompt")
    await box.fill(text)
    await box.press("Enter")


def transcript(page: Page) -> Any:
    return page.get_by_role("log", name="Transcript")


async def wait_idle(page: Page) -> None:
    await expect(page.locator("#session-state")).to_have_text("idle", timeout=WAIT_MS)


async def test_two_pages_see_a_prompt_and_its_streamed_answer_in_the_same_order(
    node: Broker, context: Any
) -> None:
    a, b = await two_pages_on_a_new_session(context, node)
    await prompt(a, "count 40")
    words = " ".join(f"w{i}" for i in range(1, 41)) + " done"
    for page in (a, b):
        await expect(transcript(page)).to_contain_text(words, timeout=WAIT_MS)
        await wait_idle(page)
    texts = [await transcript(page).inner_text() for page in (a, b)]
    assert texts[0] == texts[1]
    assert texts[0].index("count 40") < texts[0].index("w1 w2")
    # A second prompt, from the other page, lands after the first in both.
    await prompt(b, "from b")
    for page in (a, b):
        await expect(transcript(page)).to_contain_text("echo: from b", timeout=WAIT_MS)
    texts = [await transcript(page).inner_text() for page in (a, b)]
    assert texts[0] == texts[1]
    assert texts[0].index("done") < texts[0].index("from b")
    assert page_errors(a) == page_errors(b) == []


async def test_a_permission_answered_in_one_page_disappears_from_the_other(
    node: Broker, context: Any
) -> None:
    a, b = await two_pages_on_a_new_session(context, node)
    await prompt(a, "ask")
    for page in (a, b):
        await expect(page.get_by_role("button", name="Allow")).to_be_visible(timeout=WAIT_MS)
        await expect(page.locator("#session-state")).to_have_text("waiting for permission")
    await b.get_by_role("button", name="Allow").click()
    for page in (a, b):
        await expect(page.get_by_role("button", name="Allow")).to_have_count(0, timeout=WAIT_MS)
        await expect(transcript(page)).to_contain_text("allowed", timeout=WAIT_MS)
        await expect(page.locator(".tool-status")).to_have_text("completed")
        await wait_idle(page)


async def test_beside_a_session_who_is_present_its_queue_and_its_questions(
    node: Broker, context: Any
) -> None:
    """Two pages on a session and an editor window: every page lists the three present,
    the question the agent waits on, and the editor's prompt queued behind that turn; each
    goes as it ends (the answer, the queued turn's start, the editor leaving)."""
    a, b = await two_pages_on_a_new_session(context, node)
    session_id = session_of(a.url)
    editor = await RawClient.connect(f"ws://127.0.0.1:{node.port}/acp")
    info = {"name": "Zed", "version": "1"}
    await editor.call(
        "initialize", {"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": info}
    )
    load = {"sessionId": session_id, "cwd": "/srv/console", "mcpServers": []}
    assert "result" in await editor.call("session/load", load)
    for page in (a, b):
        present = page.get_by_role("list", name="Present")
        await expect(present.get_by_role("listitem")).to_have_count(3, timeout=WAIT_MS)
        await expect(present).to_contain_text("Zed")
    await prompt(a, "ask")
    for page in (a, b):
        pending = page.get_by_role("list", name="Pending interactions")
        await expect(pending).to_contain_text("permission", timeout=WAIT_MS)
    await editor.send_prompt(1, session_id, "after the question")
    for page in (a, b):
        queued = page.get_by_role("list", name="Queued prompts")
        await expect(queued).to_have_text("after the question", timeout=WAIT_MS)
    await b.get_by_role("button", name="Allow").click()
    assert (await editor.reply_to(1))["result"]["stopReason"] == "end_turn"
    for page in (a, b):
        await expect(
            page.get_by_role("list", name="Pending interactions").get_by_role("listitem")
        ).to_have_count(0, timeout=WAIT_MS)
        await expect(
            page.get_by_role("list", name="Queued prompts").get_by_role("listitem")
        ).to_have_count(0, timeout=WAIT_MS)
    await editor.close()
    for page in (a, b):
        present = page.get_by_role("list", name="Present")
        await expect(present.get_by_role("listitem")).to_have_count(2, timeout=WAIT_MS)
        await expect(present).not_to_contain_text("Zed")
    assert page_errors(a) == [] and page_errors(b) == []


async def test_renaming_in_one_page_retitles_the_other_and_the_list(
    node: Broker, context: Any
) -> None:
    a, b = await two_pages_on_a_new_session(context, node)
    await rename(a, "Quarterly report")
    for page in (a, b):
        await expect(page.get_by_role("heading", name="Quarterly report")).to_be_visible(
            timeout=WAIT_MS
        )
        row = page.get_by_role("listitem").filter(has_text="Quarterly report")
        await expect(row).to_have_count(1, timeout=WAIT_MS)
    # b's row came from session/list: it shows the agent and its status, as REST's would.
    row = b.get_by_role("listitem").filter(has_text="Quarterly report")
    await expect(row).to_contain_text("/srv/console · console · agent running", timeout=WAIT_MS)


async def test_a_session_renamed_elsewhere_is_retitled_in_a_list_that_is_not_on_it(
    node: Broker, context: Any
) -> None:
    a = await open_console(context, console_url(node))
    await new_session(a)
    b = await open_console(context, console_url(node))  # the list only: no session open
    await rename(a, "Renamed elsewhere")
    row = b.get_by_role("listitem").filter(has_text="Renamed elsewhere")
    # The broker tells b's list that it changed (its fallback poll is 30 s apart).
    await expect(row).to_have_count(1, timeout=8_000)


async def test_a_session_made_and_renamed_by_another_client_shows_in_the_list_at_once(
    node: Broker, context: Any
) -> None:
    page = await context.new_page()
    told: list[float] = []

    def on_frame(payload: str | bytes) -> None:
        message = json.loads(payload)
        if isinstance(message, dict) and message.get("method") == LIST_CHANGED_METHOD:
            told.append(asyncio.get_running_loop().time())

    page.on("websocket", lambda ws: ws.on("framereceived", on_frame))
    await page.goto(console_url(node))
    await expect(page.get_by_role("status")).to_have_text("Online", timeout=WAIT_MS)
    await expect(page.locator("#sessions-more")).not_to_have_text("Loading…", timeout=WAIT_MS)
    # Another client (not a console) of the tenant, on its own connection.
    other = await CheckedClient.open(f"ws://127.0.0.1:{node.port}/acp", 2)
    try:
        session_id = await other.new("/srv/elsewhere")
        rows = page.get_by_role("list", name="Session list").get_by_role("listitem")
        row = rows.filter(has=page.locator(f'a[href*="{session_id}"]'))
        # Told by the broker, read at once: far sooner than the fallback poll (30 s after
        # the page connected; the list was read then).
        await expect(row).to_have_count(1, timeout=LIST_PUSH_MS)
        await expect(row).to_contain_text("/srv/elsewhere")
        reply = await other.call(
            "session/set_title", {"sessionId": session_id, "title": "Named by another client"}
        )
        assert "result" in reply, reply
        await expect(row).to_contain_text("Named by another client", timeout=LIST_PUSH_MS)
        assert told, "the page was never told that the list changed"
    finally:
        await other.close()


async def test_shift_enter_is_a_new_line_and_cancel_ends_a_running_turn(
    node: Broker, context: Any
) -> None:
    page = await open_console(context, console_url(node))
    await new_session(page)
    box = page.get_by_role("textbox", name="Prompt")
    await box.fill("two")
    await box.press("Shift+Enter")
    await box.press_sequentially("lines")
    assert await box.input_value() == "two\nlines"
    await box.press("Enter")
    await expect(transcript(page)).to_contain_text("echo: two", timeout=WAIT_MS)
    await wait_idle(page)
    cancel = page.get_by_role("button", name="Cancel")
    await expect(cancel).to_be_disabled()
    await prompt(page, "slow 100")
    await expect(page.locator("#session-state")).to_have_text("running", timeout=WAIT_MS)
    await expect(transcript(page)).to_contain_text("w2 ", timeout=WAIT_MS)
    await cancel.click()
    await wait_idle(page)
    assert "done" not in await transcript(page).inner_text()


async def test_a_rich_session_renders_thoughts_plans_tools_and_markdown(
    node: Broker, context: Any, tmp_path: Path
) -> None:
    page = await open_console(context, console_url(node))
    await new_session(page)
    await prompt(page, "rich")
    log = transcript(page)
    await expect(log.get_by_role("heading", name="Summary")).to_be_visible(timeout=WAIT_MS)
    await expect(log.get_by_role("table")).to_be_visible()
    await expect(log.locator("details.thought summary")).to_have_text("Thought")
    await expect(log.locator("details.thought")).not_to_have_attribute("open", "")
    await expect(log.get_by_label("Plan")).to_contain_text("Page with cursors (in progress)")
    tool = log.get_by_label("Tool call")
    await expect(tool).to_contain_text("Edit list.py")
    await expect(tool).to_contain_text("completed")
    await expect(tool).to_contain_text("/srv/app/list.py:1")
    await expect(tool.locator("pre")).to_contain_text("+PAGE = 20")
    await wait_idle(page)
    await rename(page, "Paging the session list")
    await expect(page.get_by_role("heading", name="Paging the session list")).to_be_visible()
    await page.set_viewport_size({"width": 1280, "height": 1000})
    await page.get_by_role("textbox", name="Prompt").focus()
    shot = SCREENSHOT if os.environ.get("UPDATE_SCREENSHOT") == "1" else tmp_path / "console.png"
    await page.screenshot(path=str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG")
    # Phone width: everything stays inside the screen.
    await page.set_viewport_size({"width": 390, "height": 844})
    wide = await page.evaluate(
        """() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > 391 && e.offsetParent !== null)
            .map(e => e.tagName + '.' + e.className)"""
    )
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, wide
    await expect(page.get_by_role("textbox", name="Prompt")).to_be_visible()


async def test_hostile_agent_output_never_runs(node: Broker, context: Any) -> None:
    page = await open_console(context, console_url(node))
    response = await page.request.get(console_url(node))
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    await new_session(page)
    await prompt(page, "xss")
    log = transcript(page)
    await expect(log.get_by_role("link", name="a fine link").last).to_be_visible(timeout=WAIT_MS)
    await wait_idle(page)
    await prompt(page, "<img src=x onerror=\"window.__xss='prompt'\"> plain")
    await expect(log).to_contain_text("<img src=x onerror", timeout=WAIT_MS)  # shown as text
    await expect(log).to_contain_text("echo:", timeout=WAIT_MS)
    await wait_idle(page)
    for name in ("a javascript link", "an anchor"):
        link = log.get_by_text(name, exact=True).first
        await link.click()
    await log.get_by_text("cover").first.hover()
    await page.locator("details.thought summary").first.click()
    found = await page.evaluate(
        """() => ({
            xss: window.__xss ?? null,
            scripts: document.querySelectorAll('#transcript script').length,
            handlers: [...document.querySelectorAll('#transcript *')]
                .filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
            styles: document.querySelectorAll('#transcript [style]').length,
            frames: document.querySelectorAll('#transcript iframe').length,
            badLinks: [...document.querySelectorAll('#transcript a')]
                .filter(a => !/^https?:/.test(a.getAttribute('href') || 'https:')).length,
            fine: document.querySelector('#transcript a[href="https://example.com/"]').rel,
        })"""
    )
    assert found == {
        "xss": None,
        "scripts": 0,
        "handlers": 0,
        "styles": 0,
        "frames": 0,
        "badLinks": 0,
        "fine": "noopener noreferrer nofollow",
    }
    assert page_errors(page) == []


async def test_the_list_pages_through_300_sessions_exactly_once(
    redis_url_session: str, browser: Any
) -> None:
    store = connect(redis_url_session)
    tenant = "paging-300"
    seeded = await seed_many(
        store, 300, lambda i: {"tenant": tenant, "created_ms": BASE_MS + i, "cwd": f"/p/{i}"}
    )
    settings = make_settings(agents=[console_agent()], tenant=tenant)
    async with _own_broker(store, browser, settings) as (broker, context):
        page = await context.new_page()
        listed: list[str] = []
        pages = 0
        # The ids of the page's session/list calls: True for a next page (with a cursor). Of
        # those without one, the first reads the list's head; a later one is the console's
        # refresh of the head (every 3 s), not a page read again by scrolling.
        lists: dict[Any, bool] = {}

        def on_sent(payload: str | bytes) -> None:
            message = json.loads(payload)
            if isinstance(message, dict) and message.get("method") == "session/list":
                lists[message.get("id")] = "cursor" in (message.get("params") or {})

        def on_frame(payload: str | bytes) -> None:
            nonlocal pages
            message = json.loads(payload)
            result = message.get("result") if isinstance(message, dict) else None
            if not (isinstance(result, dict) and "sessions" in result):
                return
            if not lists.get(message.get("id")) and pages > 0:
                return  # a refresh of the head, which was read once already
            pages += 1
            listed.extend(s["sessionId"] for s in result["sessions"])

        def on_websocket(ws: Any) -> None:
            ws.on("framesent", on_sent)
            ws.on("framereceived", on_frame)

        page.on("websocket", on_websocket)
        await page.goto(console_url(broker))
        await expect(page.get_by_role("status")).to_have_text("Online", timeout=WAIT_MS)
        rows = page.get_by_role("list", name="Session list").get_by_role("listitem")
        await expect(rows.first).to_be_visible(timeout=WAIT_MS)
        assert await rows.count() < 300  # the first page only, until one scrolls
        deadline = asyncio.get_running_loop().time() + 30
        while await rows.count() < 300:
            assert asyncio.get_running_loop().time() < deadline, await rows.count()
            await rows.last.scroll_into_view_if_needed()
            await page.wait_for_timeout(50)
        await expect(page.locator("#sessions-more")).to_have_text("", timeout=WAIT_MS)
        hrefs = await rows.locator("a").evaluate_all("links => links.map(a => a.href)")
        shown = [session_of(h) for h in hrefs]
        assert sorted(shown) == sorted(s.session_id for s in seeded)
        assert sorted(listed) == sorted(shown)  # each session read from the broker once
        assert pages == 6  # 50 a page
        assert await rows.first.inner_text() != ""


async def test_sign_in_with_a_token_and_refusal_of_a_bad_one(
    redis_url_session: str, browser: Any
) -> None:
    store = connect(redis_url_session)
    settings = make_settings(agents=[console_agent()], auth="on")
    async with _own_broker(store, browser, settings) as (broker, context):
        token, _ = await TokenStore(store).create("team-console", ["read", "write"])
        page = await context.new_page()
        await page.goto(console_url(broker))
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=WAIT_MS)
        field = page.get_by_label("API token or JWT")
        await field.fill("acpb_nothing_wrong")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("alert").first).to_have_text(
            "The broker refused this token.", timeout=WAIT_MS
        )
        await expect(page.get_by_role("button", name="New session")).to_be_hidden()
        await field.fill(token)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("status")).to_have_text("Online", timeout=WAIT_MS)
        await expect(page.locator("#tenant")).to_have_text("Tenant: team-console")
        await new_session(page)
        await prompt(page, "hello")
        await expect(transcript(page)).to_contain_text("echo: hello", timeout=WAIT_MS)
        # The token stays with the tab: a reload connects straight away.
        await page.reload()
        await expect(page.get_by_role("status")).to_have_text("Online", timeout=WAIT_MS)
        await expect(transcript(page)).to_contain_text("echo: hello", timeout=WAIT_MS)


async def test_a_page_whose_front_is_killed_reconnects_to_another_and_shows_every_event_once(
    browser: Any, tmp_path: Path
) -> None:
    with redis_server() as redis_url:  # its own: the module's broker keeps the shared one
        await _killed_front(redis_url, browser, tmp_path)


async def _killed_front(redis_url: str, browser: Any, tmp_path: Path) -> None:
    agent = f"console={sys.executable} {AGENTS / 'console_agent.py'}"
    front_env = {"ACP_BROKER_CONSOLE_WS_URL": "/acp"}  # the page's origin is the balancer
    async with (
        role_process("agent-host", redis_url, tmp_path / "host.log", agents=[agent]),
        role_process("projector", redis_url, tmp_path / "projector.log"),
        broker_process(
            redis_url,
            log_path=tmp_path / "front0.log",
            agents=[agent],
            extra_args=["--no-workers"],
            env=front_env,
        ) as front0,
        broker_process(
            redis_url,
            log_path=tmp_path / "front1.log",
            agents=[agent],
            extra_args=["--no-workers"],
            env=front_env,
        ) as front1,
    ):
        backends = [Backend(f.port, f.http_port) for f in (front0, front1)]
        async with balancer(backends) as port:
            context = await browser.new_context()
            try:
                page = await open_console(context, f"http://127.0.0.1:{port}/")
                await new_session(page)
                await prompt(page, "count 5")
                await expect(transcript(page)).to_contain_text("w5 done", timeout=WAIT_MS)
                await wait_idle(page)
                await prompt(page, "slow 15")
                slow_started = re.compile(
                    r"slow 15\s*Agent\s*w1 w2 "
                )  # this turn's, not the last's
                await expect(transcript(page)).to_contain_text(slow_started, timeout=WAIT_MS)
                await front0.kill()  # the page's node dies mid-turn; the turn goes on
                await expect(page.get_by_role("status")).not_to_have_text("Online", timeout=5000)
                await expect(page.get_by_role("status")).to_have_text("Online", timeout=WAIT_MS)
                await expect(transcript(page)).to_contain_text("w15 done", timeout=WAIT_MS)
                await wait_idle(page)
                text = await transcript(page).inner_text()
                slow = " ".join(f"w{i}" for i in range(1, 16)) + " done"
                assert text.count(slow) == 1, text
                for i in range(1, 16):
                    expected = 2 if i <= 5 else 1  # w1..w5 were also the first turn's
                    assert len(re.findall(rf"\bw{i}\b", text)) == expected, (i, text)
                # And it carries on from the other node.
                await prompt(page, "after")
                await expect(transcript(page)).to_contain_text("echo: after", timeout=WAIT_MS)
                assert page_errors(page) == []
            finally:
                await context.close()
