"""A tiny loopback load balancer for browser tests: one origin in front of several nodes.

Like the compose nginx, it sends a connection whose first request is for the WebSocket
path to a node's WebSocket port and every other connection to a node's HTTP port: the
first node (in order) that accepts the TCP connection. A node that died is skipped, so a
page that reconnects lands on the next one. Bytes are piped unchanged both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from .tcp import CONNECT_TIMEOUT, pipe


@dataclass(frozen=True)
class Backend:
    """One node: its WebSocket port and its HTTP port on 127.0.0.1."""

    ws_port: int
    http_port: int


@contextlib.asynccontextmanager
async def balancer(backends: Sequence[Backend], ws_path: str = "/acp") -> AsyncIterator[int]:
    """Listen on a free loopback port (yielded) until the block ends."""
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.readline(), 10)
        except (TimeoutError, ConnectionError):
            writer.close()
            return
        parts = first.split(b" ")
        websocket = len(parts) > 1 and parts[1].split(b"?")[0] == ws_path.encode()
        for backend in backends:
            port = backend.ws_port if websocket else backend.http_port
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError):
                continue  # that node is down: the next one
            up_writer.write(first)
            pipes = [
                asyncio.ensure_future(pipe(reader, up_writer)),
                asyncio.ensure_future(pipe(up_reader, writer)),
            ]
            await asyncio.wait(pipes)
            return
        writer.close()  # no node is up

    def spawn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(handle(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(spawn, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
