"""The event loop a broker process runs on: uvloop where installed (``auto``, the default),
or the one the settings name."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import uvloop

from broker import loops

from .support.broker_process import broker_process
from .support.client import acp_client


def test_asyncio_is_the_standard_loop_and_uvloop_and_auto_are_uvloop() -> None:
    assert loops.loop_factory("asyncio") is None
    assert loops.loop_factory("uvloop") is uvloop.new_event_loop
    assert loops.loop_factory("auto") is uvloop.new_event_loop


def test_auto_without_uvloop_is_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loops.importlib.util, "find_spec", lambda name: None)
    assert loops.resolve("auto") == "asyncio"
    assert loops.loop_factory("auto") is None


def test_uvloop_asked_for_but_not_installed_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    with pytest.raises(SystemExit, match="uvloop is not installed"):
        loops.loop_factory("uvloop")


async def _serves_a_session(url: str) -> None:
    client = await acp_client(url)
    try:
        session_id = await client.new("/loop")
        reply = await client.prompt(session_id, "hello")
        assert reply.stop_reason == "end_turn"
        listed = await client.request("session/list", {})
        assert [s["sessionId"] for s in listed["sessions"]] == [session_id]
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("choice", "loop"), [(None, "uvloop"), ("asyncio", "asyncio"), ("uvloop", "uvloop")]
)
async def test_serve_runs_on_the_loop_it_is_given(
    choice: str | None, loop: str, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    env = {"ACP_BROKER_EVENT_LOOP": choice} if choice else {}
    async with broker_process(None, log_path=log, env=env) as node:
        await _serves_a_session(node.url)
    assert f"event loop: {loop}" in log.read_text()


async def test_cancel_and_wait_stops_tasks_that_take_a_cancellation_for_a_timeout() -> None:
    """A retry loop that once takes its cancellation for redis-py's read timeout (as
    ``asyncio.timeout`` can make it) is cancelled again, and so are its neighbours."""
    swallowed = asyncio.Event()

    async def retrying() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed.is_set():
                    raise
                swallowed.set()  # retried as after a timeout: the loop goes on

    async def plain() -> None:
        await asyncio.sleep(3600)

    tasks = [asyncio.create_task(retrying()), asyncio.create_task(plain())]
    await asyncio.sleep(0)  # both are waiting
    await asyncio.wait_for(loops.cancel_and_wait(*tasks, every=0.05), timeout=5)
    assert swallowed.is_set()
    assert all(task.cancelled() for task in tasks)


async def test_a_stop_that_never_ends_is_abandoned_with_the_stacks_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def stuck_forever() -> None:
        await asyncio.Event().wait()

    async def never_stops() -> None:
        await asyncio.Event().wait()

    stuck = asyncio.create_task(stuck_forever(), name="stuck-loop")
    try:
        assert not await loops.stop_within("the stuck part", never_stops(), 0.05)
    finally:
        await loops.cancel_and_wait(stuck)
    message = caplog.records[-1].getMessage()
    assert "the stuck part did not stop within 0 s; abandoned" in message
    assert "stuck_forever" in message
