"""One WebSocket connection of the stdio bridge, and the bridge's own requests on it.

The bridge asks the broker a few things itself when it reconnects (``initialize`` again,
``session/resume``, a prompt's outcome). Their answers come back among everything else the
broker sends; :meth:`Link.answered` picks them out, and a request whose connection drops
fails with :class:`LinkLost`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import CLOSE_CODE_EXPLANATIONS

from ..protocol.jsonrpc import JsonObject

__all__ = ["RECONNECT_CODES", "Link", "LinkLost", "describe_close"]

RECONNECT_CODES = frozenset({1001, 1006, 1011, 1012, 1013, 1014, 4008})
"""Close codes after which the bridge reconnects: the node went away or restarts, the
connection broke (1006: no close frame, a reset, a failed keepalive), the node was
overloaded or found the bridge too slow (4008). Any other code is an answer about the
bridge itself (a policy, a protocol error): reconnecting would get the same."""


class LinkLost(ConnectionError):
    """The connection dropped before the bridge's request was answered."""


class Link:
    """A connected WebSocket and the bridge's requests awaiting their answers on it."""

    def __init__(self, ws: ClientConnection, url: str) -> None:
        self.ws = ws
        self.url = url
        self.heard = False
        """Whether the broker has sent anything on this connection."""
        self._waiting: dict[str, asyncio.Future[JsonObject]] = {}

    async def send(self, message: JsonObject | bytes) -> None:
        """Send one message (a dict as compact JSON; bytes as they are, flagged as text)."""
        if isinstance(message, bytes):
            await self.ws.send(message, text=True)
        else:
            await self.ws.send(json.dumps(message, separators=(",", ":")))

    async def call(self, message: JsonObject) -> JsonObject:
        """Send one of the bridge's requests and return the broker's answer to it (the whole
        response: ``result`` or ``error``); :class:`LinkLost` if the connection drops."""
        key = json.dumps(message["id"])
        future: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        try:
            try:
                await self.send(message)
            except ConnectionClosed as exc:
                raise LinkLost(describe_close(self.ws)) from exc
            return await future
        finally:
            self._waiting.pop(key, None)

    def answered(self, message: Any) -> bool:
        """Take ``message`` if it answers one of the bridge's requests (True)."""
        if not isinstance(message, dict) or "method" in message or not self._waiting:
            return False
        future = self._waiting.get(json.dumps(message.get("id")))
        if future is None:
            return False
        if not future.done():
            future.set_result(message)
        return True

    def lost(self) -> None:
        """The connection dropped: every request waiting on it fails."""
        cause = describe_close(self.ws)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(LinkLost(cause))
        self._waiting.clear()

    def should_reconnect(self) -> bool:
        """Whether the way the connection ended calls for another one."""
        received = self.ws.protocol.close_rcvd
        return received is None or received.code in RECONNECT_CODES


def describe_close(ws: ClientConnection) -> str:
    """How the connection ended, in a few words: its close code, explanation and reason."""
    received = ws.protocol.close_rcvd
    if received is None:
        return "lost without a close frame (code 1006)"
    explanation = CLOSE_CODE_EXPLANATIONS.get(received.code, "unknown")
    reason = f", reason: {' '.join(received.reason.split())!r}" if received.reason else ""
    return f"code {received.code} ({explanation}){reason}"
