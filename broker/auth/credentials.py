"""Who is calling: the one place where the HTTP API and the MCP tools learn the tenant.

Every REST request and MCP tool call passes its :class:`Credentials` to an
:data:`Authenticator`, which answers with the caller's tenant or raises
:func:`unauthorized` (or :func:`forbidden`). Where authentication is on (the ``auth``
setting; by default whenever the broker listens beyond loopback) that is
:func:`bearer_access`: a bearer API token or JWT with the ``read`` scope (REST answers
``401`` or ``403`` with a problem document, MCP a result marked ``isError`` whose text
starts with ``unauthorized:`` or ``forbidden:``). Where it is off, and for ``acp-broker
mcp`` over stdio, :func:`open_access` gives every caller the configured tenant.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import ApiError, ErrorCode
from .authenticator import Authenticator as BrokerAuthenticator
from .authenticator import bearer
from .principal import AuthError, Principal, Scope, anonymous


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a caller presented."""

    transport: str
    """``http`` (REST), ``mcp-http`` (MCP over streamable HTTP) or ``mcp-stdio``."""
    authorization: str | None = None
    """The ``Authorization`` header, when the transport has one."""


Authenticator = Callable[[Credentials], Awaitable[Principal]]
"""Credentials in, the caller out (its tenant, and its roles for session checks); raises
:func:`unauthorized` to refuse."""


def unauthorized(detail: str) -> ApiError:
    """The error that refuses a caller (REST: 401 with ``WWW-Authenticate``)."""
    return ApiError(ErrorCode.UNAUTHORIZED, detail)


def forbidden(detail: str) -> ApiError:
    """The error for a caller whose credential lacks a scope (REST: 403)."""
    return ApiError(ErrorCode.FORBIDDEN, detail)


def bearer_access(authenticator: BrokerAuthenticator, scope: Scope = Scope.READ) -> Authenticator:
    """Authentication on: a bearer API token or JWT with ``scope`` (``read`` to read,
    ``write`` to change)."""

    async def authenticate(credentials: Credentials) -> Principal:
        try:
            principal = await authenticator.authenticate(bearer(credentials.authorization))
        except AuthError:
            raise unauthorized("a valid bearer token is required") from None
        if not principal.may(scope):
            raise forbidden(f"the token lacks the {scope} scope")
        return principal

    return authenticate


def open_access(tenant: str) -> Authenticator:
    """Authentication off: every caller acts as ``tenant``."""

    caller = anonymous(tenant)

    async def authenticate(credentials: Credentials) -> Principal:
        return caller

    return authenticate
