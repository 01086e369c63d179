"""JWT bearer tokens: HS256 with a shared secret, RS256/ES256 with a public key or JWKS file.

Issuer, audience and expiry are checked (PyJWT does the cryptography and the
claims); the tenant comes from a configurable claim, the scopes from ``scope``
(space separated) or ``scopes`` (a list).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from .principal import AuthError, Principal, Scope


@dataclass(frozen=True, slots=True)
class JwtConfig:
    secret: str | None = None  # HS256
    public_key_file: str | None = None  # PEM, RS256 / ES256
    jwks_file: str | None = None  # a JWKS document on disk, RS256 / ES256, by "kid"
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: str = "tenant"
    leeway: float = 30.0

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
        return Principal(tenant, _scopes(claims), f"jwt:{claims.get('sub', '?')}")

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


def _scopes(claims: dict[str, Any]) -> frozenset[str]:
    raw = claims.get("scopes", claims.get("scope", "read write"))
    names = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
    return frozenset(str(n) for n in names if n in set(Scope))
