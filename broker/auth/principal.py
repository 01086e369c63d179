"""The caller, once authenticated."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    """What a credential allows."""

    READ = "read"  # list, load, resume, watch
    WRITE = "write"  # create, prompt, cancel, set, close, delete
    ADMIN = "admin"  # manage tokens


ALL_SCOPES = frozenset(Scope)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: the tenant it acts for and what it may do."""

    tenant: str
    scopes: frozenset[str]
    subject: str  # token id or JWT subject, for logs (never the secret)
    expires: float | None = None
    """When the credential stops being good (Unix time), if it says."""
    roles: frozenset[str] | None = None
    """The session roles the credential names for its whole tenant (a token's, a JWT's
    roles claim; checked names); None: it names none (``auth.roles.default_roles``)."""

    def may(self, scope: Scope) -> bool:
        return scope in self.scopes or Scope.ADMIN in self.scopes

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires

    @property
    def token_id(self) -> str | None:
        """The API token's id, when the credential is one (revocation is checked by it)."""
        kind, _, ident = self.subject.partition(":")
        return ident if kind == "token" else None


class AuthError(Exception):
    """Credentials missing, malformed, forged, expired or revoked (the reason is for logs)."""


def anonymous(tenant: str) -> Principal:
    """Authentication off: everyone acts for the configured tenant with every scope."""
    return Principal(tenant, ALL_SCOPES, "anonymous")
