"""Turning presented credentials into a :class:`Principal`, the same way on every interface.

A credential is an API token (``acpb_…``) or a JWT, presented as ``Authorization:
Bearer``, as a WebSocket subprotocol ``acp-broker.bearer.<token>`` or a cookie
``acp_broker_token`` (for browsers, which cannot set headers on a WebSocket), or
in-band through the ACP ``authenticate`` method. With authentication off, everyone
acts for the configured tenant.
"""

from __future__ import annotations

import ipaddress
import logging
from http.cookies import SimpleCookie

from ..config import Settings
from ..store.client import Store
from .jwt_tokens import JwtConfig, JwtVerifier
from .principal import AuthError, Principal, anonymous
from .tokens import TOKEN_PREFIX, TokenStore

log = logging.getLogger(__name__)

SUBPROTOCOL_PREFIX = "acp-broker.bearer."
COOKIE_NAME = "acp_broker_token"
ACP_AUTH_METHOD = "acp-broker-token"
"""The ACP auth method id; the token goes in ``_meta["acpBroker/token"]``."""
TOKEN_META_KEY = "acpBroker/token"


def auth_enabled(settings: Settings) -> bool:
    """On by default whenever the broker listens beyond loopback."""
    if settings.auth == "on":
        return True
    if settings.auth == "off":
        return False
    return not _is_loopback(settings.host)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Authenticator:
    """Verifies API tokens and JWTs."""

    def __init__(self, settings: Settings, redis: Store) -> None:
        self.enabled = auth_enabled(settings)
        self.tenant = settings.tenant
        self.tokens = TokenStore(redis)
        self.jwt = JwtVerifier(
            JwtConfig(
                secret=settings.jwt_secret,
                public_key_file=settings.jwt_public_key_file,
                jwks_file=settings.jwt_jwks_file,
                issuer=settings.jwt_issuer,
                audience=settings.jwt_audience,
                tenant_claim=settings.jwt_tenant_claim,
                roles_claim=settings.jwt_roles_claim,
                default_scopes=tuple(settings.jwt_default_scopes),
                leeway=settings.jwt_leeway,
            )
        )

    async def authenticate(self, token: str | None) -> Principal:
        """The principal a credential stands for; :class:`AuthError` unless it is good."""
        if not self.enabled:
            return anonymous(self.tenant)
        if not token:
            raise AuthError("no credentials")
        try:
            if token.startswith(TOKEN_PREFIX):
                return await self.tokens.verify(token)
            if self.jwt.config.enabled and token.count(".") == 2:
                return self.jwt.verify(token)
        except AuthError as exc:  # the client hears only "unauthorized": the log says why
            log.info("credentials refused: %s", exc)
            raise
        raise AuthError("unrecognized credentials")


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer …`` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def websocket_token(
    authorization: str | None, subprotocols: list[str], cookie: str | None
) -> tuple[str | None, str | None]:
    """The token a WebSocket upgrade presents, and the subprotocol to echo if it came as one."""
    token = bearer(authorization)
    if token:
        return token, None
    for offered in subprotocols:
        if offered.startswith(SUBPROTOCOL_PREFIX):
            return offered.removeprefix(SUBPROTOCOL_PREFIX), offered
    if cookie:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(cookie)
        except Exception:  # a header no parser takes carries no credential: refused as none
            return None, None
        if COOKIE_NAME in jar:
            return jar[COOKIE_NAME].value, None
    return None, None
