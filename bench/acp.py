"""A small ACP (JSON-RPC over WebSocket) client for setting benchmarks up and timing requests."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect


class _JsonRpc(abc.ABC):
    """Request ids and the futures their replies resolve; a subclass sends the frames."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}

    @abc.abstractmethod
    async def _send(self, frame: bytes) -> None:
        """Put one JSON-RPC frame on the wire."""

    def _resolve(self, message: dict[str, Any]) -> None:
        msg_id = message.get("id")
        future = self._waiting.pop(msg_id, None) if isinstance(msg_id, int) else None
        if future is not None and not future.done():
            future.set_result(message)

    async def request(self, method: str, params: dict[str, Any], timeout: float = 60.0) -> Any:
        msg_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = future
        frame = {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}
        await self._send(orjson.dumps(frame))
        message = await asyncio.wait_for(future, timeout)
        if "error" in message:
            raise RuntimeError(f"{method}: {message['error']}")
        return message["result"]


class AcpClient(_JsonRpc):
    def __init__(self, ws: ClientConnection) -> None:
        super().__init__()
        self.ws = ws
        self.on_notification: Callable[[str], None] | None = None
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for frame in self.ws:
            text = frame if isinstance(frame, str) else frame.decode()
            if text.startswith('{"jsonrpc":"2.0","method"'):
                if self.on_notification is not None:
                    self.on_notification(text)
                continue
            self._resolve(orjson.loads(text))  # a lean client: the reply's decoding is not ours

    async def _send(self, frame: bytes) -> None:
        await self.ws.send(frame.decode())

    async def initialize(self) -> Any:
        return await self.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

    async def new_session(self, cwd: str) -> str:
        result = await self.request("session/new", {"cwd": cwd, "mcpServers": []})
        return str(result["sessionId"])

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        await self.ws.close()


@contextlib.asynccontextmanager
async def acp_client(url: str) -> AsyncIterator[AcpClient]:
    async with connect(url, max_size=None, compression=None, ping_interval=None) as ws:
        client = AcpClient(ws)
        await client.initialize()
        try:
            yield client
        finally:
            await client.close()


async def new_sessions(url: str, count: int, cwd: str, concurrency: int = 16) -> list[str]:
    """Create ``count`` sessions through a front node (its agent host runs them)."""
    ids: list[str] = []
    async with acp_client(url) as client:
        limit = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with limit:
                ids.append(await client.new_session(cwd))

        await asyncio.gather(*(one() for _ in range(count)))
    return ids


class LeanAcpClient(_JsonRpc):
    """JSON-RPC requests over :mod:`bench.wsclient`, the lean client every other benchmark
    drives its systems with: for timing requests, without a WebSocket library's overhead."""

    ws: Any = None

    def _on_text(self, data: bytes) -> None:
        message = orjson.loads(data)
        if "id" in message:
            self._resolve(message)

    async def _send(self, frame: bytes) -> None:
        self.ws.send_text(frame)


@contextlib.asynccontextmanager
async def lean_acp_client(url: str) -> AsyncIterator[LeanAcpClient]:
    from bench.wsclient import connect as ws_connect

    client = LeanAcpClient()
    client.ws = await ws_connect(url, client._on_text)
    try:
        await client.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        yield client
    finally:
        client.ws.close()
