"""Agent-to-client requests, routed to one connection where the session is active."""

from __future__ import annotations

from typing import Any

from ..protocol.jsonrpc import INTERNAL_ERROR, JsonObject, RpcError
from .connection import ClientConnection
from .hub import FanoutHub

# Which client capability a request needs: (capability path) per method prefix.
_NEEDS: dict[str, tuple[str, ...]] = {
    "fs/read_text_file": ("fs", "readTextFile"),
    "fs/write_text_file": ("fs", "writeTextFile"),
    "terminal/": ("terminal",),
}


def can_answer(conn: ClientConnection, method: str) -> bool:
    """Whether the connection's client said (at initialize) that it handles ``method``."""
    for prefix, path in _NEEDS.items():
        if method.startswith(prefix):
            value: Any = conn.client_capabilities
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            return bool(value)
    return True


class LocalClientRouter:
    """Sends an agent's request to the connection that sent the running prompt, else another.

    A connection that goes away before answering passes the request on to the
    next one where the session is active.
    """

    def __init__(self, hub: FanoutHub) -> None:
        self.hub = hub

    async def request_client(
        self, tenant: str, session_id: str, method: str, params: JsonObject, prefer: str | None
    ) -> Any:
        candidates = [
            conn
            for conn in self.hub.subscribers(session_id, tenant)
            if isinstance(conn, ClientConnection) and can_answer(conn, method)
        ]
        candidates.sort(key=lambda conn: conn.id != prefer)
        for conn in candidates:
            try:
                return await conn.request_client(method, params)
            except ConnectionError:
                continue
        raise RpcError(
            INTERNAL_ERROR, f"no connected client where the session is active can answer {method}"
        )
