"""The physical ceiling: a bare ``websockets.broadcast`` relay fed by Redis PUBLISH.

``python -m bench.peers.relay REDIS_URL`` listens on a free port and prints ``ready PORT``.
A client sends ``join ROOM`` (answered ``ok``); the relay subscribes to the Redis channel
``relay:ROOM`` once per room and broadcasts every message published there, as is, to the
room's connections. ``replay KEY SESSION`` reads the whole stream KEY with one XRANGE and
sends each entry to the asking connection, then ``done``: the replay ceiling.
Nothing else: no protocol, no ordering checks, no queues.
"""

from __future__ import annotations

import asyncio
import sys
from collections import defaultdict
from typing import Any, cast

import redis.asyncio as redis
from websockets.asyncio.server import ServerConnection, broadcast, serve

from bench.common import raise_nofile, run_server


async def main(url: str) -> None:
    raise_nofile()
    client = redis.Redis.from_url(url, decode_responses=True)
    pubsub = client.pubsub()
    await pubsub.subscribe("relay:_")  # so that the reader has a live connection
    rooms: dict[str, set[ServerConnection]] = defaultdict(set)

    async def handler(ws: ServerConnection) -> None:
        joined: list[str] = []
        try:
            async for message in ws:
                assert isinstance(message, str)
                verb, _, arg = message.partition(" ")
                if verb == "join":
                    if not rooms[arg]:
                        await pubsub.subscribe("relay:" + arg)
                    rooms[arg].add(ws)
                    joined.append(arg)
                    await ws.send("ok")
                elif verb == "replay":
                    key, _, session = arg.partition(" ")
                    entries = cast(
                        "list[tuple[str, dict[str, str]]]", await client.xrange(key, "-", "+")
                    )
                    head = '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"'
                    head += session + '","update":'
                    broadcast([ws], "[" + str(len(entries)) + "]")
                    for _, fields in entries:
                        broadcast([ws], head + fields["ev"] + "}}")
                    await ws.send("done")
        finally:
            for room in joined:
                rooms[room].discard(ws)

    async def read() -> None:
        while True:
            message: Any = await pubsub.get_message(timeout=1.0)
            if message is not None and message["type"] == "message":
                broadcast(rooms.get(message["channel"][6:], ()), message["data"])

    reader = asyncio.create_task(read())
    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"ready {port}", flush=True)
        await asyncio.Event().wait()
    reader.cancel()


if __name__ == "__main__":
    run_server(main(sys.argv[1]))
