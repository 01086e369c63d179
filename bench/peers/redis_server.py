"""The two-hop ceiling of ``session/list``: a bare WebSocket server in front of Redis.

``python -m bench.peers.redis_server REDIS_URL SECRET`` listens on a free port and prints
``ready PORT``. It answers JSON-RPC over WebSocket: ``initialize``, and ``session/list``
(``cwd``, ``cursor``) of the tenant ``default`` with the one read a front makes of a page
(``ZRANGE … BYLEX LIMIT``, :func:`broker.store.index.page_command`) on the index ``bench
list`` wrote, the members' ``SessionInfo`` texts spliced into the reply as a front splices
them (:func:`broker.store.index.page_of`), and the same signed cursors
(:class:`broker.store.cursors.CursorCodec`).

As little as a server can do between the two hops, with the libraries a front uses: a
request is taken where websockets parses its frame (no task, no queue, as a front takes
it), its ``ZRANGE`` written to a bare hiredis connection from that step, and the reply's
frame written to the client's socket from the step that parses Redis's reply (no task, no
future, no timer). None of the broker's authentication, tenants, rate limits, deadlines,
metrics, page cache or checks of the params (a bad request fails its connection).
"""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import hiredis
import orjson
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode

from bench.common import run_server
from broker.store.cursors import CursorCodec, fingerprint
from broker.store.index import (
    ACP_LISTING,
    Page,
    cwd_listing,
    page_command,
    page_of,
    page_with_rows,
    rows_command,
)
from broker.store.raw import command

TENANT = "default"
PAGE = 50
INITIALIZED = b'{"protocolVersion":1,"agentCapabilities":{}}'

Answer = Callable[[Any], None]


class Redis(asyncio.Protocol):
    """One connection to Redis: commands written at once, replies handed to their callbacks
    in order (Redis answers a connection's commands in the order they came)."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader()  # strings stay bytes: the page goes on as read
        self._waiting: collections.deque[Answer] = collections.deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            self._waiting.popleft()(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        raise SystemExit(f"the Redis connection was lost: {exc}")

    def ask(self, packed: bytes, answer: Answer) -> None:
        self._waiting.append(answer)
        self.transport.write(packed)  # type: ignore[union-attr]


class Lister:
    """Pages of the index: the request's ZRANGE sent, its reply spliced and framed."""

    def __init__(self, redis: Redis, secret: str) -> None:
        self.redis = redis
        self.codec = CursorCodec([secret.encode()])
        self._marks: dict[str | None, tuple[str, str]] = {}  # cwd -> (listing, fingerprint)

    def listing(self, cwd: str | None) -> tuple[str, str]:
        known = self._marks.get(cwd)
        if known is None:
            filters = {"cwd": cwd} if cwd is not None else {}
            listing = cwd_listing(cwd) if cwd is not None else ACP_LISTING
            known = self._marks[cwd] = (listing, fingerprint(TENANT, "acp", filters))
        return known

    def page(self, ws: ServerConnection, head: bytes, params: dict[str, Any]) -> None:
        listing, mark = self.listing(params.get("cwd"))
        cursor = params.get("cursor")
        after = self.codec.decode(cursor, mark) if cursor is not None else None
        packed = command(*page_command(TENANT, listing, after, PAGE))

        def answer(members: Any) -> None:
            page = page_of(members, PAGE)
            if page is not None:
                reply(page)
                return
            # A cwd's listing holds bare positions: the rows give their SessionInfo.
            split, rows = rows_command(TENANT, members, PAGE)
            more = len(members) > PAGE
            self.redis.ask(command(*rows), lambda got: reply(page_with_rows(split, got, more)))

        def reply(page: Page) -> None:
            parts = [head, b'{"sessions":[', page.infos]
            if page.has_more and page.last is not None:
                next_cursor = orjson.dumps(self.codec.encode(page.last, mark))
                parts += [b'],"nextCursor":', next_cursor, b"}}"]
            else:
                parts.append(b"]}}")
            write(ws, parts)

        self.redis.ask(packed, answer)


def write(ws: ServerConnection, parts: list[bytes]) -> None:
    """One text frame (FIN, unmasked, no extension) of ``parts``, straight to the socket."""
    size = sum(map(len, parts))
    if size < 126:
        frame_head = bytes((0x81, size))
    elif size < 65536:
        frame_head = b"\x81\x7e" + size.to_bytes(2, "big")
    else:
        frame_head = b"\x81\x7f" + size.to_bytes(8, "big")
    ws.transport.write(b"".join([frame_head, *parts]))


def connection_class(lister: Lister) -> type[ServerConnection]:
    """A websockets connection that answers each text message as its frame is parsed."""

    class Connection(ServerConnection):
        def process_event(self, event: Any) -> None:
            if type(event) is Frame and event.opcode is Opcode.TEXT and event.fin:
                request = orjson.loads(event.data)
                head = b'{"jsonrpc":"2.0","id":' + orjson.dumps(request["id"]) + b',"result":'
                if request["method"] == "session/list":
                    lister.page(self, head, request.get("params") or {})
                else:
                    write(self, [head, INITIALIZED, b"}"])
                return
            super().process_event(event)

    return Connection


async def main(url: str, secret: str) -> None:
    where = urlparse(url)
    loop = asyncio.get_running_loop()
    host = where.hostname or "127.0.0.1"
    _, redis = await loop.create_connection(Redis, host, where.port or 6379)
    lister = Lister(redis, secret)

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    async with serve(
        handler,
        "127.0.0.1",
        0,
        compression=None,
        max_size=None,
        ping_interval=None,
        create_connection=connection_class(lister),
    ) as server:
        print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    run_server(main(*sys.argv[1:3]))
