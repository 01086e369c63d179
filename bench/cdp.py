"""Headless Chromium driven over the DevTools protocol with nothing but ``Target``, ``Page``
and ``Runtime``: for timing pages as a user's browser runs them.

Playwright (which the tests use) enables the ``Network`` domain on every page it drives, so
the browser copies each WebSocket frame to the driver; a page that receives 10,000 frames
then runs several times slower than in a browser nobody watches. This driver asks for no
events at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import websockets

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.redis_server import free_port


class Browser:
    """One connection to the browser; calls carry a target's session id where they need one."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            message = json.loads(raw)
            future = self._waiting.pop(message.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(message)

    async def call(self, method: str, params: dict[str, Any], session: str | None = None) -> Any:
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        message: dict[str, Any] = {"id": call_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        await self.ws.send(json.dumps(message))
        reply = await asyncio.wait_for(future, 60)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def time_until(self, url: str, condition: str, timeout_s: float) -> Any:
        """Open ``url`` in a fresh browser context (cold cache) and return what ``condition``
        (a JavaScript function, polled every animation frame) first returns truthy."""
        context = (await self.call("Target.createBrowserContext", {}))["browserContextId"]
        try:
            target = await self.call(
                "Target.createTarget", {"url": "about:blank", "browserContextId": context}
            )
            attached = await self.call(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
            )
            session = attached["sessionId"]
            await self.call("Page.navigate", {"url": url}, session)
            poll = (
                f"new Promise(done => {{ const f = ({condition}); const tick = () => "
                f"{{ const v = f(); v ? done(v) : requestAnimationFrame(tick) }}; tick() }})"
            )
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                reply = await self.call(
                    "Runtime.evaluate",
                    {"expression": poll, "awaitPromise": True, "returnByValue": True},
                    session,
                )
                if "exceptionDetails" not in reply:
                    return reply["result"].get("value")
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"{url}: {reply['exceptionDetails']}")
                await asyncio.sleep(0.01)  # the page is not there yet (still navigating)
        finally:
            await self.call("Target.disposeBrowserContext", {"browserContextId": context})


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Debian's Chromium with a private profile, headless, until the block ends.

    It runs in a process group of its own: at the end it is asked to close (it then ends
    its renderers and flushes its profile), and the group is killed if it has not gone in
    5 s, so that no renderer outlives the run or writes into the profile being removed.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="acpb-chromium-") as profile:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *CHROMIUM_ARGS,
            f"--remote-debugging-port={port}",
            f"--user-data-dir={profile}",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            url = await _endpoint(port, 30.0)
            async with websockets.connect(url, max_size=None) as ws:
                browser = Browser(ws)
                try:
                    yield browser
                finally:
                    browser._reader.cancel()
                    with contextlib.suppress(ConnectionError, websockets.ConnectionClosed):
                        await ws.send(json.dumps({"id": 0, "method": "Browser.close"}))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group: the browser and its children
            await proc.wait()


async def _endpoint(port: int, timeout_s: float) -> str:
    """The browser's DevTools WebSocket, once it answers on ``port``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            raw = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/json/version")
            return str(json.loads(raw)["webSocketDebuggerUrl"])
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())
