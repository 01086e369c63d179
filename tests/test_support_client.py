"""The tests' raw ACP client: a reader cancelled while a frame arrives stops (Python 3.11's
``asyncio.wait_for`` returned the frame and swallowed the cancellation, so such a reader,
looping on short receive timeouts, read on for ever and hung its test's teardown)."""

from __future__ import annotations

import asyncio
import contextlib
import json

from websockets.asyncio.server import ServerConnection, serve

from .support.client import RawClient


async def _two_frames_per_request(ws: ServerConnection) -> None:
    async for _ in ws:
        await ws.send(json.dumps({"jsonrpc": "2.0", "method": "a"}))
        await ws.send(json.dumps({"jsonrpc": "2.0", "method": "b"}))


async def _read_for_ever(client: RawClient) -> None:
    while True:
        with contextlib.suppress(TimeoutError):
            client.inbox.append(await client.recv(1.0))


async def test_a_reader_cancelled_as_its_frame_arrives_stops() -> None:
    async with serve(_two_frames_per_request, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        client = await RawClient.connect(f"ws://127.0.0.1:{port}")
        try:
            # Cancel after each number of loop steps, so that one cancellation lands in the
            # step where the reader's (already buffered) frame is handed over.
            for steps in range(8):
                await client.ws.send("{}")
                await client.recv(5.0)  # "a"; "b" came in the same write: it is buffered
                reader = asyncio.create_task(_read_for_ever(client))
                for _ in range(steps):
                    await asyncio.sleep(0)
                reader.cancel()
                done, _ = await asyncio.wait([reader], timeout=3.0)
                assert done, f"a reader cancelled after {steps} steps read on"
                assert reader.cancelled()
                client.inbox.clear()
        finally:
            await client.close()
