"""The session/list peer as a server: PostgreSQL's keyset query behind a WebSocket.

``python -m bench.peers.pg_server DSN TABLE SECRET`` listens on a free port and prints
``ready PORT``. It answers JSON-RPC over WebSocket, as a front node does: ``initialize``,
and ``session/list`` (``cwd``, ``cursor``) with one prepared keyset query a page on the
table ``bench list`` loaded (an index over (tenant, updated_at desc, id), and one with cwd
first), the rows' JSON texts spliced into the reply, and the same signed cursors as the
broker's (:class:`broker.store.cursors.CursorCodec`, position ``<updated_at>:<id>``).

The least a PostgreSQL-backed broker would do a page: no authentication, no rate limit, no
method table, one connection to the database.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import asyncpg
import orjson
from websockets.asyncio.server import ServerConnection, serve

from bench.common import run_server
from broker.store.cursors import CursorCodec, InvalidCursor, fingerprint

TENANT = "default"
PAGE = 50
_COLUMNS = "SELECT id, updated_at, row FROM {t} WHERE tenant = $1"
_ORDER = " ORDER BY updated_at DESC, id LIMIT {limit}"
_AFTER = " AND updated_at <= ${a} AND (updated_at < ${a} OR id > ${b})"


class Lister:
    """The four prepared keyset queries (first page or after a position; all or one cwd)."""

    def __init__(self, conn: Any, table: str, secret: str) -> None:
        self.conn, self.table = conn, table
        self.codec = CursorCodec([secret.encode()])
        self.queries: dict[tuple[bool, bool], Any] = {}

    async def prepare(self) -> None:
        base, order = _COLUMNS.format(t=self.table), _ORDER.format(limit=PAGE + 1)
        self.queries = {
            (False, False): await self.conn.prepare(base + order),
            (False, True): await self.conn.prepare(base + _AFTER.format(a=2, b=3) + order),
            (True, False): await self.conn.prepare(base + " AND cwd = $2" + order),
            (True, True): await self.conn.prepare(
                base + " AND cwd = $2" + _AFTER.format(a=3, b=4) + order
            ),
        }

    async def page(self, params: dict[str, Any]) -> str:
        cwd = params.get("cwd")
        mark = fingerprint(TENANT, "acp", {"cwd": cwd} if cwd is not None else {})
        args: list[Any] = [TENANT] + ([cwd] if cwd is not None else [])
        cursor = params.get("cursor")
        if cursor is not None:
            when, _, last_id = self.codec.decode(cursor, mark).partition(":")
            args += [int(when), last_id]
        rows = await self.queries[(cwd is not None, cursor is not None)].fetch(*args)
        text = '{"sessions":[' + ",".join(r["row"] for r in rows[:PAGE]) + "]"
        if len(rows) > PAGE:
            last = rows[PAGE - 1]
            position = f"{last['updated_at']}:{last['id']}"
            text += ',"nextCursor":' + orjson.dumps(self.codec.encode(position, mark)).decode()
        return text + "}"


async def main(dsn: str, table: str, secret: str) -> None:
    lister = Lister(await asyncpg.connect(dsn), table, secret)
    await lister.prepare()

    async def handler(ws: ServerConnection) -> None:
        async for message in ws:
            request = orjson.loads(message)
            head = '{"jsonrpc":"2.0","id":' + orjson.dumps(request["id"]).decode()
            try:
                if request["method"] == "session/list":
                    result = await lister.page(request.get("params") or {})
                else:
                    result = '{"protocolVersion":1,"agentCapabilities":{}}'
                await ws.send(head + ',"result":' + result + "}")
            except (InvalidCursor, ValueError) as exc:
                error = {"code": -32602, "message": str(exc)}
                await ws.send(head + ',"error":' + orjson.dumps(error).decode() + "}")

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    run_server(main(*sys.argv[1:4]))
