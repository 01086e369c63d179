"""Who may do what on an ACP connection, and how fast.

The principal comes from the upgrade's credentials, or in-band from ACP
``authenticate`` (v1) / ``auth/login`` (v2) with the token in
``_meta["acpBroker/token"]``. Until then every method but ``initialize`` and
those answers -32000. Every other method needs a scope (:func:`needed_scope`: the
docs/security.md has the table): ``read`` to list and watch, ``write`` to change; a credential
without it gets -32000 ``forbidden``. Requests are paced per connection and per
credential (:mod:`.flow`), and a connection may have a bounded number of sessions
active.

Connection places are counted per connection id from the upgrade's admission until its
socket is gone, whatever became of the handshake, and move to the credential that
authenticates in band (which is then held to its own cap).
"""

from __future__ import annotations

import functools
import time
from typing import Any

from ...auth.authenticator import ACP_AUTH_METHOD, TOKEN_META_KEY, Authenticator
from ...auth.principal import AuthError, Principal, Scope
from ...config import Settings
from ...ops import metrics
from ...protocol.jsonrpc import (
    AUTH_REQUIRED,
    LIMIT_EXCEEDED,
    JsonObject,
    Request,
    RpcError,
    invalid_params,
)
from ...protocol.operations import MUTATIONS
from .flow import Pace, TokenRates

READ_METHODS = frozenset({"session/list", "session/load", "session/resume"})
WRITE_METHODS = MUTATIONS | frozenset(
    {"interaction/claim", "interaction/release", "interaction/respond"}
)
FORBIDDEN_DATA: JsonObject = {"condition": "forbidden", "retryable": False}
"""``data`` of a refusal for want of a scope (the ACP Remote drafts' condition)."""
LOGINS_PER_SECOND = 1.0
"""In-band logins a connection may try per second (bursts of two): a guesser is slow."""
OPEN_METHODS = frozenset({"initialize", "authenticate", "auth/login", "auth/logout"})
"""Answered before authentication (``authenticate`` and ``auth/login`` are rate limited)."""


def needed_scope(method: str) -> Scope:
    """The scope a method needs: write for what changes a session, read for everything else
    (a method the broker does not know included: it answers -32601 only to a reader)."""
    return Scope.WRITE if method in WRITE_METHODS else Scope.READ


class Access:
    """The node's access rules: authentication state, scopes, rate limits."""

    def __init__(self, settings: Settings, authenticator: Authenticator) -> None:
        self.settings = settings
        self.authenticator = authenticator
        self.rates = TokenRates(authenticator.tokens.redis, settings.rate_per_token)
        self._connections: dict[str, int] = {}  # subject -> connections
        self._places: dict[str, str] = {}  # connection id -> subject counted

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

    def check(self, principal: Principal | None, request: Request) -> None:
        """Raise the error a request earns, if any (rates are kept by :mod:`.flow`)."""
        if request.method in OPEN_METHODS:
            return
        if principal is None:
            raise RpcError(AUTH_REQUIRED, "authentication required: authenticate first")
        if principal.expired(time.time()):
            raise RpcError(AUTH_REQUIRED, "the credential has expired: authenticate again")
        scope = needed_scope(request.method)
        if not principal.may(scope):
            raise RpcError(
                AUTH_REQUIRED,
                f"forbidden: {request.method} needs the {scope} scope",
                FORBIDDEN_DATA,  # the drafts' condition: a client tells it from a login prompt
            )

    async def login(self, params: JsonObject, attempts: Pace) -> Principal:
        """ACP ``authenticate`` / ``auth/login``: the principal the token in ``_meta`` names.

        ``attempts`` is the connection's budget of logins: spent, a login is refused
        (-32005 ``logins``) without the token being looked at, so guessing is slow.
        """
        if attempts.spend(1) > 0:  # a guesser that keeps trying stays refused
            raise _limit("logins", attempts.rate)
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

    def open_connection(self, conn_id: str, principal: Principal | None) -> str | None:
        """Count connection ``conn_id`` in; the reason it is refused, if it is. Its place is
        held until :meth:`close_connection`, which must follow whatever happens next."""
        if len(self._places) >= self.settings.max_connections:
            return "too many connections on this node"
        subject = counted_subject(principal)
        if self._full(subject):
            return "too many connections for this credential"
        self._take(conn_id, subject)
        return None

    def rebind_connection(self, conn_id: str, principal: Principal | None) -> str | None:
        """Move a connection's place to the credential it authenticated with in band; the
        reason it is refused (that credential's connections are at their cap), if it is."""
        subject = counted_subject(principal)
        if self._places.get(conn_id) == subject:
            return None
        if self._full(subject):
            return "too many connections for this credential"
        if conn_id not in self._places:
            return None  # the socket is gone already
        self._release(conn_id)
        self._take(conn_id, subject)
        return None

    def close_connection(self, conn_id: str) -> None:
        """Give connection ``conn_id``'s place back (idempotent)."""
        self._release(conn_id)

    def _full(self, subject: str) -> bool:
        per_token = self.settings.max_connections_per_token
        return subject != "" and self._connections.get(subject, 0) >= per_token

    def _take(self, conn_id: str, subject: str) -> None:
        self._places[conn_id] = subject
        self._connections[subject] = self._connections.get(subject, 0) + 1

    def _release(self, conn_id: str) -> None:
        subject = self._places.pop(conn_id, None)
        if subject is None:
            return
        left = self._connections.get(subject, 0) - 1
        if left > 0:
            self._connections[subject] = left
        else:
            self._connections.pop(subject, None)


def counted_subject(principal: Principal | None) -> str:
    """Whose cap a connection counts against ("": none, before in-band auth or with auth off)."""
    if principal is None or principal.subject == "anonymous":
        return ""
    return principal.subject


def connection_limit(reason: str) -> RpcError:
    """The error of an in-band login whose credential has its connections at the cap."""
    return RpcError(
        LIMIT_EXCEEDED, f"limit exceeded: {reason}", {"limit": "max_connections_per_token"}
    )


def _limit(name: str, value: Any) -> RpcError:
    metrics.REFUSED.labels(name).inc()
    return RpcError(LIMIT_EXCEEDED, f"limit exceeded: {name} ({value}/s)", {"limit": name})


def in_flight_limit(settings: Settings) -> RpcError:
    """The error of a request beyond ``max_requests_in_flight`` unanswered ones."""
    return RpcError(
        LIMIT_EXCEEDED,
        f"limit exceeded: at most {settings.max_requests_in_flight} requests in flight on a "
        "connection: wait for replies",
        {"limit": "max_requests_in_flight"},
    )


def waiting_limit(settings: Settings) -> RpcError:
    """The error of a request read while more are waiting for the connection's pace than
    it serves within ``max_pace`` (see :func:`~.flow.waiting_bound`)."""
    _WAITING_REFUSED.inc()
    return _waiting_error(settings.rate_per_connection, settings.max_pace)


_WAITING_REFUSED = metrics.REFUSED.labels("rate_per_connection")


@functools.lru_cache(maxsize=8)
def _waiting_error(rate: float, max_pace: float) -> RpcError:
    """Made once: a flood of requests is refused at the rate frames are parsed."""
    return RpcError(
        LIMIT_EXCEEDED,
        f"limit exceeded: rate_per_connection ({rate:g}/s): more requests wait on this "
        f"connection than it is served in {max_pace:g} s: wait for replies",
        {"limit": "rate_per_connection"},
    )


def token_rate_limit(settings: Settings) -> RpcError:
    """The error of requests whose credential had no room left within ``max_pace``."""
    return _limit("rate_per_token", settings.rate_per_token)


def session_limit(settings: Settings) -> RpcError:
    return RpcError(
        LIMIT_EXCEEDED,
        f"limit exceeded: at most {settings.max_sessions_per_connection} sessions active on a "
        "connection",
        {"limit": "max_sessions_per_connection"},
    )
