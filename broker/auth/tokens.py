"""API tokens: created, listed and revoked with ``acp-broker token …``, stored hashed.

A token reads ``acpb_<id>_<secret>``. Redis keeps, under the id, the tenant, the
scopes, the session roles it was made with (none: ``auth.roles.default_roles``) and a
SHA-256 of the secret, never the secret itself; verification hashes
what was presented and compares in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..store.client import Store
from ..store.names import TENANT_RULE, is_tenant
from ..store.tokens import TokenRecords
from .principal import AuthError, Principal, Scope
from .roles import parse_roles

TOKEN_PREFIX = "acpb_"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What is stored about a token (no secret)."""

    id: str
    tenant: str
    scopes: list[str]
    name: str
    created: float
    revoked: bool
    roles: list[str] | None = None
    """The session roles it holds on every session of its tenant (None: the defaults)."""

    def to_json(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "id": self.id,
            "tenant": self.tenant,
            "scopes": self.scopes,
            "name": self.name,
            "created": self.created,
            "revoked": self.revoked,
        }
        if self.roles is not None:
            info["roles"] = self.roles
        return info


class TokenStore:
    """API tokens in Redis."""

    def __init__(self, redis: Store) -> None:
        self.redis = redis
        self.records = TokenRecords(redis)

    async def create(
        self, tenant: str, scopes: list[str], name: str = "", roles: list[str] | None = None
    ) -> tuple[str, TokenInfo]:
        """A new token: returns the token (shown once) and what is stored about it.
        ``roles``: the session roles it holds on its tenant's sessions (None: the defaults
        of its scopes); ``ValueError`` names an unknown one."""
        unknown = set(scopes) - set(Scope)
        if unknown or not scopes:
            raise ValueError(f"scopes must be some of {', '.join(Scope)}; got {scopes}")
        if not is_tenant(tenant):
            raise ValueError(f"tenant must be {TENANT_RULE}")
        held = None if roles is None else sorted(str(role) for role in parse_roles(roles))
        token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        info = TokenInfo(token_id, tenant, sorted(set(scopes)), name, time.time(), False, held)
        record = {**info.to_json(), "hash": _digest(secret)}
        await self.records.add(token_id, json.dumps(record))
        return f"{TOKEN_PREFIX}{token_id}_{secret}", info

    async def list(self, tenant: str | None = None) -> list[TokenInfo]:
        infos = []
        for token_id in await self.records.ids():
            raw = await self.records.get(token_id)
            if raw:
                info = _info(json.loads(raw))
                if tenant is None or info.tenant == tenant:
                    infos.append(info)
        return infos

    async def revoke(self, token_id: str) -> bool:
        """Revoke a token; False if there is no such token."""
        raw = await self.records.get(token_id)
        if not raw:
            return False
        record = json.loads(raw)
        record["revoked"] = True
        await self.records.replace(token_id, json.dumps(record))
        return True

    async def revoked(self, token_ids: Iterable[str]) -> set[str]:
        """Which of these tokens are revoked or gone (open connections holding them are cut)."""
        ids = list(token_ids)
        records = await self.records.get_many(ids)
        return {
            token_id
            for token_id, raw in zip(ids, records, strict=True)
            if not raw or json.loads(raw).get("revoked")
        }

    async def verify(self, token: str) -> Principal:
        """The principal a token stands for; :class:`AuthError` unless it is valid."""
        if not token.startswith(TOKEN_PREFIX):
            raise AuthError("not an API token")
        token_id, sep, secret = token.removeprefix(TOKEN_PREFIX).partition("_")
        if not sep or not token_id.isalnum() or not secret:
            raise AuthError("malformed API token")
        raw = await self.records.get(token_id)
        record: dict[str, Any] = (
            json.loads(raw) if raw else {"hash": _digest("\0"), "revoked": True}
        )
        # Compare even for unknown ids, so timing does not tell which ids exist.
        matches = hmac.compare_digest(str(record["hash"]), _digest(secret))
        if not raw or not matches or record.get("revoked"):
            raise AuthError("unknown or revoked API token")
        if not is_tenant(record["tenant"]):  # stored before tenant names were checked
            raise AuthError("the API token's tenant is not a valid tenant name")
        roles = record.get("roles")
        return Principal(
            record["tenant"],
            frozenset(record["scopes"]),
            f"token:{token_id}",
            roles=None if roles is None else frozenset(roles),
        )


def _info(record: dict[str, Any]) -> TokenInfo:
    return TokenInfo(
        record["id"],
        record["tenant"],
        list(record["scopes"]),
        record.get("name", ""),
        float(record["created"]),
        bool(record.get("revoked")),
        record.get("roles"),
    )
