"""A Streamable HTTP ACP client for tests: POSTs with httpx, GET streams read into queues."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx

JSON = {"Content-Type": "application/json"}
SSE = {"Accept": "text/event-stream"}
WAIT = 20.0


class Stream:
    """One GET stream: its events (id, message) in a queue, read by a task."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.status: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.comments = 0

    async def next(self, timeout: float = WAIT) -> tuple[int, Any]:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def until(self, match: Any, timeout: float = WAIT) -> list[tuple[int, Any]]:
        """Every event up to and including the first ``match(message)`` is true of."""
        seen = []
        async with asyncio.timeout(timeout):
            while True:
                event = await self.events.get()
                seen.append(event)
                if match(event[1]):
                    return seen

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


class HttpAcp:
    """One Streamable HTTP connection; ``bases`` the fronts' HTTP base URLs, used in turn."""

    def __init__(self, bases: list[str], token: str | None = None) -> None:
        self.bases = bases
        self.turn = 0
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(30.0))
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.conn_id: str | None = None
        self.next_id = 0
        self.streams: list[Stream] = []

    def url(self) -> str:
        base = self.bases[self.turn % len(self.bases)]
        self.turn += 1
        return base + "/acp"

    def headers(self, session_id: str | None = None, **extra: str) -> dict[str, str]:
        headers = {**self.auth, **extra}
        if self.conn_id:
            headers["Acp-Connection-Id"] = self.conn_id
        if session_id:
            headers["Acp-Session-Id"] = session_id
        return headers

    async def initialize(self, version: int = 1, **capabilities: Any) -> Any:
        body = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": version, "clientCapabilities": capabilities},
        }
        response = await self.client.post(self.url(), json=body, headers=self.headers(**JSON))
        assert response.status_code == 200, response.text
        self.conn_id = response.headers["Acp-Connection-Id"]
        return response.json()

    async def post(self, message: Any, session_id: str | None = None) -> httpx.Response:
        return await self.client.post(
            self.url(), content=json.dumps(message), headers=self.headers(session_id, **JSON)
        )

    async def request(self, method: str, params: Any, session_id: str | None = None) -> Any:
        """POST a request (202); its id."""
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        response = await self.post(message, session_id)
        assert response.status_code == 202, response.text
        return self.next_id

    async def open(self, session_id: str | None = None, last_event_id: int | None = None) -> Stream:
        """Open a GET stream (waits for its status)."""
        stream = Stream()
        headers = self.headers(session_id, **SSE)
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        stream.task = asyncio.create_task(self._read(stream, self.url(), headers))
        self.streams.append(stream)
        status = await asyncio.wait_for(asyncio.shield(stream.status), WAIT)
        assert status == 200, status
        return stream

    async def _read(self, stream: Stream, url: str, headers: dict[str, str]) -> None:
        async with self.client.stream("GET", url, headers=headers) as response:
            stream.status.set_result(response.status_code)
            if response.status_code != 200:
                return
            async for event_id, data, comment in sse_events(response.aiter_lines()):
                if comment:
                    stream.comments += 1
                else:
                    await stream.events.put((event_id, json.loads(data)))

    async def delete(self) -> httpx.Response:
        return await self.client.request("DELETE", self.url(), headers=self.headers())

    async def aclose(self) -> None:
        for stream in self.streams:
            await stream.close()
        await self.client.aclose()


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[int, str, bool]]:
    """(id, data, is_comment) of each SSE event (ids as integers; comments have none)."""
    event_id, data = 0, []
    async for line in lines:
        if line.startswith(":"):
            yield 0, "", True
        elif line.startswith("id:"):
            event_id = int(line[3:].strip())
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield event_id, "\n".join(data), False
            data = []


def is_response(msg_id: Any) -> Any:
    return lambda message: (
        isinstance(message, dict)
        and message.get("id") == msg_id
        and ("result" in message or "error" in message)
    )
