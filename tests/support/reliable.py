"""A client of ACP Remote's reliable transport on WebSocket (the draft's provisional names),
as a v2 client that negotiates it would be: it checks every delivery record follows the
last one it applied (sequence = cursor, one more each time), and keeps what it applied."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import websockets
from websockets.typing import Subprotocol

SUBPROTOCOL = Subprotocol("acp.remote.v2")
WAIT = 60.0


def opening(connection: dict[str, Any], msg_id: int = 0) -> dict[str, Any]:
    """An ``initialize`` asking for the reliable transport (``connection``: new or resume)."""
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "initialize",
        "params": {
            "protocolVersion": 2,
            "info": {"name": "reliable-test", "version": "1"},
            "capabilities": {"remote": {"core": {}}},
            "remote": {
                "profile": "acp.remote.v2",
                "operationId": f"op_init_{msg_id}",
                "clientInstanceId": "client_test",
                "connection": connection,
            },
        },
    }


class ReliableClient:
    """One logical connection, over one socket after another."""

    def __init__(self) -> None:
        self.ws: Any = None
        self.conn_id = ""
        self.generation = ""
        self.secret = ""
        self.cursor = 0
        """The last cursor applied."""
        self.applied: list[tuple[int, Any]] = []
        """Every record applied: (cursor, JSON-RPC message)."""
        self.errors: list[dict[str, Any]] = []
        """Raw (unsequenced) error responses the broker sent."""
        self._ids = itertools.count(1)

    async def connect(self, url: str, *, resume: bool = False) -> dict[str, Any]:
        """Open a socket and initialize (a new connection, or resume this one after
        :attr:`cursor`): the raw answer."""
        if self.ws is not None:
            await self.ws.close()
        self.ws = await websockets.connect(url, subprotocols=[SUBPROTOCOL], max_size=None)
        connection: dict[str, Any] = {"type": "new", "bootstrapProof": "x" * 43}
        if resume:
            connection = {
                "type": "resume",
                "connectionId": self.conn_id,
                "generation": self.generation,
                "resumeSecret": self.secret,
                "afterCursor": str(self.cursor),
            }
        await self.ws.send(json.dumps(opening(connection)))
        answer: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), WAIT))
        if "result" in answer:
            remote = answer["result"]["remote"]
            self.conn_id, self.generation = remote["connectionId"], remote["generation"]
            self.secret = remote["resumeSecret"]
            if not resume:
                self.cursor = int(remote["startCursor"])
        return answer

    def frame(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "connectionId": self.conn_id, "generation": self.generation, **fields}

    async def submit(self, method: str, params: dict[str, Any], msg_id: Any = None) -> Any:
        """Submit a request (``msg_id`` None: a new id); its id."""
        msg_id = next(self._ids) if msg_id is None else msg_id
        message = {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}
        await self.send_message(message)
        return msg_id

    async def send_message(self, message: Any, operation: str | None = None) -> None:
        payload = {"type": "jsonrpc", "message": message}
        operation = operation or f"op_{next(self._ids)}"
        frame = self.frame("submission", operationId=operation, payload=payload)
        await self.ws.send(json.dumps(frame))

    async def ack(self) -> None:
        await self.ws.send(json.dumps(self.frame("ack", cursor=str(self.cursor))))

    async def until(self, done: Any, timeout: float = WAIT) -> list[Any]:
        """Apply records until one's message satisfies ``done``: their messages."""
        seen: list[Any] = []
        async with asyncio.timeout(timeout):
            while True:
                record = json.loads(await self.ws.recv())
                if record.get("type") != "delivery":
                    self.errors.append(record)
                    continue
                assert record["connectionId"] == self.conn_id
                assert record["generation"] == self.generation
                assert record["sequence"] == record["cursor"] == str(self.cursor + 1), (
                    record["cursor"],
                    self.cursor,
                )
                self.cursor += 1
                message = record["payload"]["message"]
                self.applied.append((self.cursor, message))
                seen.append(message)
                if any(done(m) for m in (message if isinstance(message, list) else [message])):
                    return seen

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A request and its response (what came before it is applied too)."""
        msg_id = await self.submit(method, params)
        messages = await self.until(lambda m: is_response(msg_id)(m))
        reply: dict[str, Any] = messages[-1]
        return reply


def is_response(msg_id: Any) -> Any:
    return lambda m: isinstance(m, dict) and "method" not in m and m.get("id") == msg_id


def flat(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages with batches as their entries."""
    return [m for item in messages for m in (item if isinstance(item, list) else [item])]
