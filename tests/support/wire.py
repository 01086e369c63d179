"""A raw JSON-RPC client that checks every message it receives against the ACP schema.

:class:`CheckedClient` negotiates a protocol version, validates each incoming message
against that version's official schema (:mod:`.schemas`), answers permission requests
by itself, and keeps what it was sent in order.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import websockets

from .client import LOADED_WAIT, RawClient, text
from .schemas import WireChecker, extensions_asked

INIT_PARAMS: dict[int, dict[str, Any]] = {
    1: {"protocolVersion": 1, "clientCapabilities": {}},
    2: {"protocolVersion": 2, "capabilities": {}, "info": {"name": "test", "version": "1"}},
}


class CheckedClient(RawClient):
    """A RawClient whose every received message is schema-checked for its version."""

    def __init__(self, ws: Any, version: int) -> None:
        super().__init__(ws)
        self.checker: WireChecker = WireChecker(version)
        self.received: list[Any] = []  # messages: a batch of notifications as its entries
        self.batch_sizes: list[int] = []  # the entries of each batch of notifications received
        self._unpacked: deque[Any] = deque()
        self.permission: str | None = "allow_once"  # option to pick; None: leave unanswered
        self.permission_requests: list[dict[str, Any]] = []
        self.idle: dict[str, int] = {}  # session id -> turns ended (idle state updates) so far

    @classmethod
    async def open(
        cls,
        url: str,
        version: int = 2,
        *,
        meta: dict[str, Any] | None = None,
        token: str | None = None,
    ) -> CheckedClient:
        """Connect (with ``token`` as the bearer credential, if given) and ``initialize`` with
        ``version`` (and ``meta`` as the capabilities' ``_meta``); the reply must negotiate it."""
        headers = {"Authorization": f"Bearer {token}"} if token else None
        ws = await websockets.connect(url, max_size=None, additional_headers=headers)
        client = cls(ws, version)
        client.checker.extensions = extensions_asked(meta)
        params = INIT_PARAMS[version]
        if meta is not None:
            caps = "capabilities" if version == 2 else "clientCapabilities"
            params = {**params, caps: {**params[caps], "_meta": meta}}
        reply = await client.call("initialize", params)
        assert reply["result"]["protocolVersion"] == version, reply
        return client

    async def recv(self, timeout: float = LOADED_WAIT) -> Any:
        """The next message; a batch of notifications (a replay, for a client that asked
        for them in batches) is handed out entry by entry, its size kept in ``batch_sizes``.
        A batch reply to a batch request stays a list."""
        if self._unpacked:
            message = self._unpacked.popleft()
        else:
            message = await super().recv(timeout)  # checked there, a batch entry by entry
            if _notifications(message):
                self.batch_sizes.append(len(message))
                self._unpacked.extend(message[1:])
                message = message[0]
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
        assert "result" in reply, reply
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

    async def until_idle(
        self, session_id: str, count: int = 1, timeout: float = LOADED_WAIT
    ) -> None:
        """Receive until ``count`` turns of the session have ended (idle state updates)."""
        await self.read_until(lambda: self.idle.get(session_id, 0) >= count, timeout)

    def texts(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        return "".join(
            u["update"]["content"].get("text", "")
            for u in self.updates(session_id)
            if u["update"]["sessionUpdate"] == kind
        )


def _notifications(message: Any) -> bool:
    """Whether ``message`` is a batch of notifications only (never a reply to a batch)."""
    return (
        isinstance(message, list)
        and bool(message)
        and all(isinstance(m, dict) and "method" in m and "id" not in m for m in message)
    )
