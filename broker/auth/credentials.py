"""Who is calling: the one place where the HTTP API and the MCP tools learn the tenant.

Every REST request and MCP tool call passes its :class:`Credentials` to an
:data:`Authenticator`, which answers with the caller's tenant or raises
:func:`unauthorized` (or :func:`forbidden`). Where authentication is on (the ``auth``
setting; by default whenever the broker listens beyond loopback) that is
:func:`bearer_access`: a bearer API token or JWT with the ``read`` scope (REST answers
``401`` or ``403`` with a problem document, MCP a result marked ``isError`` whose text
starts with ``unauthorized:`` or ``forbidden:``). Where it is off, and for ``acp-broker
mcp`` over stdio, :func:`open_access` gives every caller the configured tenant.
:func:`bearer_identity` and :func:`open_identity` answer the same with the caller's
principal subject beside the tenant (what the session tools record as a prompt's author
or an interaction's answerer, and key operation ids by): the subject an ACP connection
with the same credential has (where authentication is off, everyone's, as on ACP:
:func:`~.principal.anonymous`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import ApiError, ErrorCode
from .authenticator import Authenticator as BrokerAuthenticator
from .authenticator import bearer
from .principal import AuthError, Scope, anonymous


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a caller presented."""

    transport: str
    """``http`` (REST), ``mcp-http`` (MCP over streamable HTTP) or ``mcp-stdio``."""
    authorization: str | None = None
    """The ``Authorization`` header, when the transport has one."""


Authenticator = Callable[[Credentials], Awaitable[str]]
"""Credentials in, the caller's tenant out; raises :func:`unauthorized` to refuse."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a caller is: its tenant and its principal's subject (a token id, a JWT subject;
    ``anonymous`` where authentication is off)."""

    tenant: str
    subject: str


Identify = Callable[[Credentials], Awaitable[Caller]]
"""Credentials in, the :class:`Caller` out; raises as an :data:`Authenticator` does."""


def unauthorized(detail: str) -> ApiError:
    """The error that refuses a caller (REST: 401 with ``WWW-Authenticate``)."""
    return ApiError(ErrorCode.UNAUTHORIZED, detail)


def forbidden(detail: str) -> ApiError:
    """The error for a caller whose credential lacks a scope (REST: 403)."""
    return ApiError(ErrorCode.FORBIDDEN, detail)


def bearer_access(authenticator: BrokerAuthenticator, scope: Scope = Scope.READ) -> Authenticator:
    """Authentication on: a bearer API token or JWT with ``scope`` (``read`` to read,
    ``write`` to change)."""
    identify = bearer_identity(authenticator, scope)

    async def authenticate(credentials: Credentials) -> str:
        return (await identify(credentials)).tenant

    return authenticate


def bearer_identity(authenticator: BrokerAuthenticator, scope: Scope = Scope.READ) -> Identify:
    """:func:`bearer_access`, answering the :class:`Caller`."""

    async def identify(credentials: Credentials) -> Caller:
        try:
            principal = await authenticator.authenticate(bearer(credentials.authorization))
        except AuthError:
            raise unauthorized("a valid bearer token is required") from None
        if not principal.may(scope):
            raise forbidden(f"the token lacks the {scope} scope")
        return Caller(principal.tenant, principal.subject)

    return identify


def open_access(tenant: str) -> Authenticator:
    """Authentication off: every caller acts as ``tenant``."""

    async def authenticate(credentials: Credentials) -> str:
        return tenant

    return authenticate


def open_identity(tenant: str) -> Identify:
    """:func:`open_access`, answering the :class:`Caller` (the subject every ACP
    connection has where authentication is off)."""
    caller = Caller(tenant, anonymous(tenant).subject)

    async def identify(credentials: Credentials) -> Caller:
        return caller

    return identify
