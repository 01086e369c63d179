"""The peer: a python-socketio server node with its Redis manager (aiohttp, WebSocket).

``python -m bench.peers.socketio_server REDIS_URL`` listens on a free port and prints
``ready PORT``. A client connects to ``/socket.io/?EIO=4&transport=websocket`` and emits
``join`` with a room name (acknowledged); messages emitted to the room from anywhere
(an ``AsyncRedisManager(write_only=True)``) reach every node's members of the room.
"""

from __future__ import annotations

import asyncio
import sys

import socketio
from aiohttp import web

from bench.common import raise_nofile, run_server


async def main(url: str) -> None:
    raise_nofile()
    manager = socketio.AsyncRedisManager(url)
    sio = socketio.AsyncServer(
        async_mode="aiohttp", client_manager=manager, transports=["websocket"]
    )

    @sio.on("join")
    async def join(sid: str, room: str) -> str:
        await sio.enter_room(sid, room)
        return "ok"

    app = web.Application()
    sio.attach(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"ready {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    run_server(main(sys.argv[1]))
