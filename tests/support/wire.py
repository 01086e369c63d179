"""A raw JSON-RPC client that checks every message it receives against the ACP schema.

:class:`CheckedClient` negotiates a protocol version, validates each incoming message
against that version's official schema (:mod:`.schemas`), answers permission requests
by itself, and keeps what it was sent in order.
"""

from __future__ import annotations

from typing import Any

import websockets

from .client import RawClient, text
from .schemas import WireChecker

INIT_PARAMS: dict[int, dict[str, Any]] = {
    1: {"protocolVersion": 1, "clientCapabilities": {}},
    2: {"protocolVersion": 2, "capabilities": {}, "info": {"name": "test", "version": "1"}},
}


class CheckedClient(RawClient):
    """A RawClient whose every received message is schema-checked for its version."""

    def __init__(self, ws: Any, version: int) -> None:
        super().__init__(ws)
        self.checker: WireChecker = WireChecker(version)
        self.received: list[Any] = []
        self.permission: str | None = "allow_once"  # option to pick; None: leave unanswered
        self.permission_requests: list[dict[str, Any]] = []
        self.idle: dict[str, int] = {}  # session id -> turns ended (idle state updates) so far

    @classmethod
    async def open(cls, url: str, version: int = 2) -> CheckedClient:
        """Connect and ``initialize`` with ``version``; the reply must negotiate it."""
        client = cls(await websockets.connect(url, max_size=None), version)
        reply = await client.call("initialize", INIT_PARAMS[version])
        assert reply["result"]["protocolVersion"] == version, reply
        return client

    async def recv(self, timeout: float = 10.0) -> Any:
        message = await super().recv(timeout)  # checked there
        self.received.append(message)
        self._count_idle(message)
        if isinstance(message, dict) and message.get("method") == "session/request_permission":
            self.permission_requests.append(message)
            if self.permission is not None:
                await self.answer_permission(message, self.permission)
        return message

    def _count_idle(self, message: Any) -> None:
        if isinstance(message, dict) and message.get("method") == "session/update":
            update = message["params"]["update"]
            if update["sessionUpdate"] == "state_update" and update["state"] == "idle":
                sid = message["params"]["sessionId"]
                self.idle[sid] = self.idle.get(sid, 0) + 1

    async def answer_permission(self, request: dict[str, Any], option: str) -> None:
        outcome = {"outcome": "selected", "optionId": option}
        await super().send({"jsonrpc": "2.0", "id": request["id"], "result": {"outcome": outcome}})

    # -- sessions ---------------------------------------------------------------------------

    async def new(self, cwd: str = "/tmp/v2", **params: Any) -> str:
        reply = await self.call("session/new", {"cwd": cwd, **params})
        return str(reply["result"]["sessionId"])

    async def prompt(self, session_id: str, words: str) -> dict[str, Any]:
        return await self.call("session/prompt", {"sessionId": session_id, "prompt": text(words)})

    def updates(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The ``session/update`` params received so far, in order."""
        return [
            m["params"]
            for m in self.received
            if isinstance(m, dict)
            and m.get("method") == "session/update"
            and (session_id is None or m["params"]["sessionId"] == session_id)
        ]

    def kinds(self, session_id: str | None = None) -> list[str]:
        return [u["update"]["sessionUpdate"] for u in self.updates(session_id)]

    def states(self, session_id: str | None = None) -> list[str]:
        """The v2 ``state_update``s, as ``state`` or ``state:stopReason``."""
        out = []
        for params in self.updates(session_id):
            update = params["update"]
            if update["sessionUpdate"] == "state_update":
                reason = update.get("stopReason")
                out.append(update["state"] + (f":{reason}" if reason else ""))
        return out

    async def until_idle(self, session_id: str, count: int = 1, timeout: float = 20.0) -> None:
        """Receive until ``count`` turns of the session have ended (idle state updates)."""
        await self.read_until(lambda: self.idle.get(session_id, 0) >= count, timeout)

    def texts(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        return "".join(
            u["update"]["content"].get("text", "")
            for u in self.updates(session_id)
            if u["update"]["sessionUpdate"] == kind
        )
