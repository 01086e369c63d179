"""Credentials checked again while connections stay open: revoked or expired, cut off.

A credential is verified when a connection opens (or authenticates in band), but a
connection can live for days. :class:`CredentialWatch` looks at every open connection
of the node each ``credential_check_interval`` seconds: one whose JWT is past its
``exp`` (plus the leeway) or whose API token has been revoked (or deleted) is closed
with :data:`CLOSE_CREDENTIAL_REVOKED`, so the cut comes within that interval; so is one
admitted without credentials (in-band auth) that has not authenticated within
``login_timeout``, so that anonymous sockets cannot hold the node's places for good. Between
two checks, an expired JWT's requests are already refused (-32000) by
:meth:`~.access.Access.check`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from ..auth.principal import Principal
from ..auth.tokens import TokenStore

log = logging.getLogger(__name__)

CLOSE_CREDENTIAL_REVOKED = 4001
"""Close code for a connection whose credential was revoked or has expired: get a new one,
then reconnect."""


class Watched(Protocol):
    """What the watch needs of a connection."""

    principal: Principal | None
    unauthenticated_since: float | None
    """``time.monotonic()`` since when it has had no principal (in-band auth pending)."""

    def cut(self, code: int, reason: str) -> None:
        """Close the connection (at once, without waiting for anything in flight)."""


class CredentialWatch:
    """Cuts the connections whose credentials went bad, every ``interval`` seconds."""

    def __init__(
        self,
        tokens: TokenStore,
        connections: Callable[[], Iterable[Watched]],
        interval: float,
        login_timeout: float,
    ) -> None:
        self.tokens = tokens
        self.connections = connections
        self.interval = interval
        self.login_timeout = login_timeout

    async def run(self) -> None:
        """Check every ``interval`` seconds until cancelled (a loop of the front's
        :class:`~broker.lifetimes.RoleLoops`)."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # Redis away: the next round checks again (and logs again)
                log.exception("could not check the open connections' credentials")

    async def check(self) -> None:
        """One round: cut what is expired now or revoked in the store."""
        now, clock = time.time(), time.monotonic()
        by_token: dict[str, list[Watched]] = {}
        for conn in list(self.connections()):
            principal = conn.principal
            if principal is None:
                since = conn.unauthenticated_since
                if since is not None and clock - since > self.login_timeout:
                    conn.cut(CLOSE_CREDENTIAL_REVOKED, "not authenticated in time")
                continue
            if principal.expired(now):
                log.info("closing a connection of %s: its credential expired", principal.subject)
                conn.cut(CLOSE_CREDENTIAL_REVOKED, "credential expired")
                continue
            token_id = principal.token_id
            if token_id is not None:
                by_token.setdefault(token_id, []).append(conn)
        if not by_token:
            return
        for token_id in await self.tokens.revoked(by_token):
            for conn in by_token[token_id]:
                # The principal may have changed (in-band auth) since the round began.
                if conn.principal is not None and conn.principal.token_id == token_id:
                    log.info("closing a connection of token:%s: it was revoked", token_id)
                    conn.cut(CLOSE_CREDENTIAL_REVOKED, "credential revoked")
