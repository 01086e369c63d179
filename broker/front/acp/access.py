"""Who may do what on an ACP connection, and how fast.

The principal comes from the upgrade's credentials, or in-band from ACP
``authenticate`` (v1) / ``auth/login`` (v2) with the token in
``_meta["acpBroker/token"]``. Until then every method but ``initialize`` and
those answers -32000. Methods that change sessions need the ``write`` scope.
Requests are rate limited per connection and per credential (token bucket,
per node), and a connection may have a bounded number of sessions active.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ...auth.authenticator import ACP_AUTH_METHOD, TOKEN_META_KEY, Authenticator
from ...auth.principal import AuthError, Principal, Scope
from ...config import Settings
from ...protocol.jsonrpc import AUTH_REQUIRED, JsonObject, Request, RpcError, invalid_params

LIMIT_EXCEEDED = -32005
"""JSON-RPC server error: a rate or size limit of the broker was hit (``data.limit`` says which)."""

WRITE_METHODS = frozenset(
    {
        "session/new",
        "session/fork",
        "session/prompt",
        "session/cancel",
        "session/set_mode",
        "session/set_config_option",
        "session/set_title",
        "session/delete",
    }
)
OPEN_METHODS = frozenset({"initialize", "authenticate", "auth/login", "auth/logout"})


@dataclass
class TokenBucket:
    """``rate`` requests per second, bursts up to ``2 * rate``."""

    rate: float
    tokens: float = -1.0
    stamp: float = field(default_factory=time.monotonic)

    def take(self) -> bool:
        now = time.monotonic()
        capacity = 2 * self.rate
        if self.tokens < 0:
            self.tokens = capacity
        self.tokens = min(capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class Access:
    """The node's access rules: authentication state, scopes, rate limits."""

    def __init__(self, settings: Settings, authenticator: Authenticator) -> None:
        self.settings = settings
        self.authenticator = authenticator
        self._token_buckets: dict[str, TokenBucket] = {}
        self._connections: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.authenticator.enabled

    def auth_methods(self, version: int) -> list[JsonObject]:
        """What ``initialize`` advertises: the token method, when authentication is on."""
        if not self.enabled:
            return []
        method: JsonObject = {
            "name": "Broker token",
            "description": f"An API token or JWT in _meta[{TOKEN_META_KEY!r}]",
        }
        if version >= 2:
            return [{"type": "agent", "methodId": ACP_AUTH_METHOD, **method}]
        return [{"id": ACP_AUTH_METHOD, **method}]

    def check(self, principal: Principal | None, bucket: TokenBucket, request: Request) -> None:
        """Raise the error a request earns, if any."""
        if request.method in OPEN_METHODS:
            return
        if principal is None:
            raise RpcError(AUTH_REQUIRED, "authentication required: authenticate first")
        if request.method in WRITE_METHODS and not principal.may(Scope.WRITE):
            raise RpcError(AUTH_REQUIRED, f"forbidden: {request.method} needs the write scope")
        if not bucket.take():
            raise _limit("rate_per_connection", self.settings.rate_per_connection)
        shared = self._token_buckets.setdefault(
            principal.subject, TokenBucket(self.settings.rate_per_token)
        )
        if principal.subject != "anonymous" and not shared.take():
            raise _limit("rate_per_token", self.settings.rate_per_token)

    async def login(self, params: JsonObject) -> Principal:
        """ACP ``authenticate`` / ``auth/login``: the principal the token in ``_meta`` names."""
        if params.get("methodId") != ACP_AUTH_METHOD:
            raise invalid_params(f"methodId must be {ACP_AUTH_METHOD!r}")
        meta = params.get("_meta")
        token = meta.get(TOKEN_META_KEY) if isinstance(meta, dict) else None
        if not isinstance(token, str):
            raise invalid_params(f"put the token in _meta[{TOKEN_META_KEY!r}]")
        try:
            return await self.authenticator.authenticate(token)
        except AuthError:
            raise RpcError(AUTH_REQUIRED, "authentication failed") from None

    def open_connection(self, principal: Principal | None) -> str | None:
        """Count a connection in; the reason it is refused, if it is."""
        total = sum(self._connections.values())
        if total >= self.settings.max_connections:
            return "too many connections on this node"
        subject = principal.subject if principal else ""
        per_token = self.settings.max_connections_per_token
        if subject not in ("", "anonymous") and self._connections.get(subject, 0) >= per_token:
            return "too many connections for this credential"
        self._connections[subject] = self._connections.get(subject, 0) + 1
        return None

    def close_connection(self, principal: Principal | None) -> None:
        subject = principal.subject if principal else ""
        left = self._connections.get(subject, 0) - 1
        if left > 0:
            self._connections[subject] = left
        else:
            self._connections.pop(subject, None)


def _limit(name: str, value: Any) -> RpcError:
    return RpcError(LIMIT_EXCEEDED, f"limit exceeded: {name} ({value}/s)", {"limit": name})


def session_limit(settings: Settings) -> RpcError:
    return RpcError(
        LIMIT_EXCEEDED,
        f"limit exceeded: at most {settings.max_sessions_per_connection} sessions active on a "
        "connection",
        {"limit": "max_sessions_per_connection"},
    )
