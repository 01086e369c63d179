"""A loopback TCP proxy in front of one Redis that a test switches to another: a failover
as the broker sees it (its connections cut, new ones reach the new master), without
Sentinel's timing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from .tcp import CONNECT_TIMEOUT, pipe


class SwitchingProxy:
    """Pipes each connection to ``127.0.0.1:<target>``; :meth:`switch` cuts every open one
    and sends new ones to another port."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def switch(self, target: int) -> None:
        self.target = target
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except (OSError, TimeoutError):
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}

    def spawn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self.handle(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@contextlib.asynccontextmanager
async def switching_proxy(target: int) -> AsyncIterator[SwitchingProxy]:
    """A :class:`SwitchingProxy` listening on a free loopback port until the block ends."""
    proxy = SwitchingProxy(target)
    server = await asyncio.start_server(proxy.spawn, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        proxy.switch(proxy.target)
        for task in list(proxy._tasks):
            task.cancel()
        await asyncio.gather(*proxy._tasks, return_exceptions=True)
        await server.wait_closed()
