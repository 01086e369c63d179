"""The GET streams of Streamable HTTP connections: a scope's stored messages as SSE.

A stream reads its scope's messages from the store (:class:`~broker.store.http_links.HttpLinks`),
after a cursor, and sends each as ``id: <cursor>`` and one ``data:`` line. Where it starts:
after ``Last-Event-ID`` when the client sends one (any front: the messages are in the
store), else after what the scope's last stream sent, so that a stream opened again sends
nothing twice. It waits for news on a bell (rung by the front that stored it, on this
node's channel) and looks by itself every ``http_poll_interval`` (a bell may be lost).
Comment lines every ``http_heartbeat`` keep proxies from closing it; they carry no id and
move no cursor.

A stream also sees that someone runs its connection: when its holder crashed (its lease
lapsed) and no request came since, the stream's front takes it over, so what the
connection's sessions ask meanwhile (an agent asks again until answered) reaches it.

One stream per scope: a new GET of the same scope takes over and the older one ends (a
client reconnecting after a half-open stream gets in). A client that does not read within
``http_write_timeout`` is cut; what it missed waits in the store for its next GET.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Receive, Scope, Send

from ...auth.principal import Principal
from ...store.http_links import HttpLinks
from .bell import Bell
from .service import StreamableHttp

MEDIA_TYPE = "text/event-stream"
READ_COUNT = 256
"""Messages read from the store per round trip."""
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # nginx: no buffering of this response
]


def message_frame(cursor: int, text: str) -> bytes:
    """One stored message as an SSE event (its text is one line of JSON)."""
    return f"id: {cursor}\ndata: {text}\n\n".encode()


class ScopeStream:
    """One GET stream of a connection's scope, from cursor ``after``."""

    def __init__(
        self, service: StreamableHttp, conn_id: str, scope: str, after: int, principal: Principal
    ) -> None:
        self.service = service
        self.principal = principal
        self.links: HttpLinks = service.links
        self.conn_id = conn_id
        self.scope = scope
        self.after = after
        self.reader = f"{service.node}|{uuid.uuid4().hex}"

    async def frames(self) -> AsyncIterator[bytes]:
        """The stream's bytes, until the connection ends or another stream takes the scope."""
        settings = self.service.settings
        bell = Bell()
        key = (self.conn_id, self.scope)
        self.service.bells[key] = bell
        await self.links.set_reader(self.conn_id, self.scope, self.reader)
        quiet_since = checked = time.monotonic()
        saved = self.after
        try:
            yield b": open\n\n"
            while not self.service.stopping:
                bell.event.clear()
                rows = bell.take(self.after)
                if rows is None:
                    rows = await self.links.read(self.conn_id, self.scope, self.after, READ_COUNT)
                if rows:  # one write for what came together
                    yield b"".join([message_frame(cursor, text) for cursor, text in rows])
                now = time.monotonic()
                if rows:
                    self.after, quiet_since = rows[-1][0], now
                # Who reads the scope, looked at when nothing came (a bell with nothing new:
                # a DELETE, a newer stream) and once a poll interval while busy.
                if not rows or now - checked >= settings.http_poll_interval:
                    checked = now
                    reader, _ = await self.links.reader(self.conn_id, self.scope)
                    if reader != self.reader:
                        return  # the connection ended, or a newer stream took the scope
                    if self.after != saved:  # where a stream opened with no id starts
                        saved = self.after
                        await self.links.save(self.conn_id, {"p:" + self.scope: str(saved)})
                    await self.links.touch(self.conn_id)  # an open stream is a use
                    await self.service.ensure_held(self.conn_id, self.principal)
                if len(rows) == READ_COUNT:
                    continue  # more waits
                if now - quiet_since >= settings.http_heartbeat:
                    quiet_since = now
                    yield b": keepalive\n\n"
                if not bell.event.is_set():
                    with contextlib.suppress(TimeoutError):  # a timer, not a task, per wait
                        async with asyncio.timeout(settings.http_poll_interval):
                            await bell.event.wait()
        finally:
            if self.service.bells.get(key) is bell:
                del self.service.bells[key]
            if self.after != saved:
                with contextlib.suppress(Exception):  # a stream ending as its store went away
                    await self.links.save(self.conn_id, {"p:" + self.scope: str(self.after)})


class SseResponse:
    """An ASGI response sending ``frames``; a client that does not take a write within
    ``write_timeout`` seconds, or leaves, ends it."""

    def __init__(self, frames: AsyncIterator[bytes], write_timeout: float) -> None:
        self.frames = frames
        self.write_timeout = write_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            async for chunk in self.frames:
                if gone.done():
                    return
                message: dict[str, Any] = {
                    "type": "http.response.body",
                    "body": chunk,
                    "more_body": True,
                }
                try:
                    async with asyncio.timeout(self.write_timeout):  # a timer, not a task
                        await send(message)
                except TimeoutError:
                    return  # a client that does not read is cut; it resumes from its last id
        finally:
            gone.cancel()
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                await aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
