"""JWT bearer tokens: HS256 with a shared secret, RS256/ES256 with a public key or JWKS file.

Issuer, audience and expiry are checked (PyJWT does the cryptography and the
claims); the tenant comes from a configurable claim, the scopes from ``scope``
(space separated) or ``scopes`` (a list), or, when it has neither, the setting
``jwt_default_scopes``. The session roles it holds on every session of its tenant come
from a configurable claim (``jwt_roles_claim``, by default ``roles``: a list of role names,
or one space-separated string); a token without it holds the defaults of its scopes, one
naming an unknown role is refused (the reason, in the log, names it). A tenant claim that
is not a valid tenant name (:mod:`broker.store.names`) is refused like a forged token. The
principal expires with the token (``exp`` plus the leeway): open connections are cut then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from ..store.names import TENANT_RULE, is_tenant
from .principal import AuthError, Principal, Scope
from .roles import parse_roles


@dataclass(frozen=True, slots=True)
class JwtConfig:
    secret: str | None = None  # HS256
    public_key_file: str | None = None  # PEM, RS256 / ES256
    jwks_file: str | None = None  # a JWKS document on disk, RS256 / ES256, by "kid"
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: str = "tenant"
    roles_claim: str = "roles"
    leeway: float = 30.0
    default_scopes: tuple[str, ...] = ("read", "write")
    """The scopes of a JWT with neither a ``scope`` nor a ``scopes`` claim."""

    @property
    def enabled(self) -> bool:
        return bool(self.secret or self.public_key_file or self.jwks_file)


class JwtVerifier:
    """Verifies JWTs against the configured keys."""

    def __init__(self, config: JwtConfig) -> None:
        self.config = config
        self._public_key = (
            Path(config.public_key_file).read_text() if config.public_key_file else None
        )
        self._jwks = (
            jwt.PyJWKSet.from_dict(json.loads(Path(config.jwks_file).read_text()))
            if config.jwks_file
            else None
        )

    def verify(self, token: str) -> Principal:
        try:
            key, algorithms = self._key_for(token)
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                issuer=self.config.issuer,
                audience=self.config.audience,
                leeway=self.config.leeway,
                options={"require": ["exp"]},
            )
        except jwt.PyJWTError as exc:
            raise AuthError(f"invalid JWT: {exc}") from None
        tenant = claims.get(self.config.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise AuthError(f"the JWT has no {self.config.tenant_claim!r} claim")
        if not is_tenant(tenant):
            raise AuthError(f"the JWT's {self.config.tenant_claim!r} claim is not {TENANT_RULE}")
        exp = claims["exp"]
        return Principal(
            tenant,
            _scopes(claims, self.config.default_scopes),
            f"jwt:{claims.get('sub', '?')}",
            expires=float(exp) + self.config.leeway,
            roles=_roles(claims, self.config.roles_claim),
        )

    def _key_for(self, token: str) -> tuple[Any, list[str]]:
        header = jwt.get_unverified_header(token)
        alg = header.get("alg")
        if alg == "HS256" and self.config.secret:
            return self.config.secret, ["HS256"]
        if alg in ("RS256", "ES256"):
            if self._jwks is not None:
                kid = header.get("kid")
                for jwk in self._jwks.keys:
                    if jwk.key_id == kid:
                        return jwk.key, [alg]
                raise jwt.InvalidKeyError(f"no key {kid!r} in the JWKS")
            if self._public_key is not None:
                return self._public_key, [alg]
        raise jwt.InvalidAlgorithmError(f"algorithm {alg!r} is not accepted here")


def _roles(claims: dict[str, Any], claim: str) -> frozenset[str] | None:
    """The roles ``claim`` names (None: the claim is absent); :class:`AuthError` unless
    it is a list of known role names or one space-separated string of them."""
    if claim not in claims:
        return None
    raw = claims[claim]
    names = raw.split() if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise AuthError(f"the JWT's {claim!r} claim is not a list of role names")
    try:
        return frozenset(parse_roles(names))
    except ValueError as exc:
        raise AuthError(f"the JWT's {claim!r} claim: {exc}") from None


def _scopes(claims: dict[str, Any], default: tuple[str, ...]) -> frozenset[str]:
    """``scopes`` (a list) or ``scope`` (space separated); neither: ``default``."""
    raw = claims.get("scopes", claims.get("scope", " ".join(default)))
    names = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
    return frozenset(str(n) for n in names if n in set(Scope))
