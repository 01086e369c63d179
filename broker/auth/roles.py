"""Session roles and permissions: the vocabulary of the ACP Remote security draft.

A role is a bundle of permissions (``rfds-remote-security-and-identity``): an ``observer``
reads, a ``controller`` also prompts and steers, an ``approver`` also answers the agent's
questions, an ``owner`` may do everything, sharing the session included. Authorization asks
for a :class:`Permission`, never for a role's name: a principal holding several roles holds
the union of their permissions, bounded by what its credential's scopes allow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from .. import fastjson
from .principal import Principal, Scope


class Role(StrEnum):
    """A session role (the draft's names)."""

    OBSERVER = "observer"
    CONTROLLER = "controller"
    APPROVER = "approver"
    OWNER = "owner"


class Permission(StrEnum):
    """What an operation on a session needs (the draft's permission registry)."""

    READ = "session.read"
    WRITE = "session.write"
    CONTROL = "session.control"
    APPROVE = "session.approve"
    PRESENCE = "session.presence"
    ADMIN = "session.admin"


BUNDLES: dict[Role, frozenset[Permission]] = {
    Role.OBSERVER: frozenset({Permission.READ, Permission.PRESENCE}),
    Role.CONTROLLER: frozenset(
        {Permission.READ, Permission.PRESENCE, Permission.WRITE, Permission.CONTROL}
    ),
    Role.APPROVER: frozenset({Permission.READ, Permission.PRESENCE, Permission.APPROVE}),
    Role.OWNER: frozenset(Permission),
}
"""Each role's permissions."""

SCOPE_BOUNDS: dict[str, frozenset[Permission]] = {
    Scope.READ: frozenset({Permission.READ, Permission.PRESENCE}),
    # The broker's write scope covers close and delete (docs/auth.md): it bounds the
    # session's administration too; an owner's role is what grants it on a session.
    Scope.WRITE: frozenset(
        {Permission.WRITE, Permission.CONTROL, Permission.APPROVE, Permission.ADMIN}
    ),
    Scope.ADMIN: frozenset(Permission),
}
"""The permissions each credential scope allows at most (a scope is an upper bound: it
grants nothing on a session by itself)."""


def scope_bound(principal: Principal) -> frozenset[Permission]:
    """Every permission ``principal``'s scopes allow."""
    return bound_of(principal.scopes)


def bound_of(scopes: Iterable[str]) -> frozenset[Permission]:
    """Every permission credential scopes ``scopes`` allow."""
    allowed: set[Permission] = set()
    for scope in scopes:
        allowed |= SCOPE_BOUNDS.get(scope, frozenset())
    return frozenset(allowed)


def permissions_of(roles: Iterable[Role], principal: Principal) -> frozenset[Permission]:
    """The permissions ``roles`` grant ``principal``, bounded by its credential's scopes."""
    return _granted(roles) & scope_bound(principal)


def _granted(roles: Iterable[Role]) -> frozenset[Permission]:
    granted: set[Permission] = set()
    for role in roles:
        granted |= BUNDLES[role]
    return frozenset(granted)


def parse_roles(names: Iterable[str]) -> frozenset[Role]:
    """``names`` as roles; raises ``ValueError`` naming the first unknown one."""
    roles: set[Role] = set()
    for name in names:
        try:
            roles.add(Role(name))
        except ValueError:
            known = ", ".join(r.value for r in Role)
            raise ValueError(f"unknown role {name!r} (known: {known})") from None
    return frozenset(roles)


def default_roles(principal: Principal) -> frozenset[Role]:
    """The roles a credential holds on every session of its tenant when nothing else says:
    a plain client is a controller (and approver) where its token allows writing, an
    observer where it only reads, an owner with the admin scope."""
    if principal.may(Scope.ADMIN) and Scope.ADMIN in principal.scopes:
        return frozenset(Role)
    if principal.may(Scope.WRITE):
        return frozenset({Role.CONTROLLER, Role.APPROVER})
    if principal.may(Scope.READ):
        return frozenset({Role.OBSERVER})
    return frozenset()


def tenant_roles(principal: Principal) -> frozenset[Role]:
    """The roles ``principal``'s credential holds on every session of its tenant: the roles
    it names (a token's, a JWT's roles claim), or :func:`default_roles` when it names none."""
    if principal.roles is None:
        return default_roles(principal)
    return parse_roles(principal.roles)


ENTRY_PREFIX = "access_"


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One session ACL entry (the draft's shape): a principal, its roles, maybe an expiry.

    ``principal_id`` is the principal's subject as the broker knows it (``token:<id>``,
    ``jwt:<sub>``). The entry id is made from it, so granting a subject again replaces its
    entry, as the draft says, and two grants to different subjects never collide."""

    entry_id: str
    principal_id: str
    roles: frozenset[Role]
    expires_at: float | None = None
    """Unix time the entry stops granting anything (None: no expiry)."""

    def live(self, now: float) -> bool:
        return self.expires_at is None or now < self.expires_at

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "entryId": self.entry_id,
            "subject": {"type": "principal", "principalId": self.principal_id},
            "roles": sorted(self.roles),
        }
        if self.expires_at is not None:
            entry["expiresAt"] = rfc3339(self.expires_at)
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> AclEntry:
        """An entry as :meth:`to_json` wrote it (stored entries only: trusted)."""
        expires = entry.get("expiresAt")
        return cls(
            str(entry["entryId"]),
            str(entry["subject"]["principalId"]),
            parse_roles(entry["roles"]),
            parse_time(expires) if isinstance(expires, str) else None,
        )


def entry_id_for(principal_id: str) -> str:
    """The id of ``principal_id``'s entry (one per subject on a session)."""
    return ENTRY_PREFIX + hashlib.sha256(principal_id.encode()).hexdigest()[:16]


def grant_entry(
    principal_id: str, roles: Iterable[str], expires_at: float | None = None
) -> AclEntry:
    """A new entry for a grant; ``ValueError`` for an empty or unknown role list."""
    names = list(roles)
    if not names:
        raise ValueError("roles must name at least one role")
    if len(set(names)) != len(names):
        raise ValueError("roles must not repeat a role")
    if not principal_id:
        raise ValueError("subject.principalId must be a non-empty string")
    return AclEntry(entry_id_for(principal_id), principal_id, parse_roles(names), expires_at)


def acl_entries(stored: Iterable[str]) -> list[AclEntry]:
    """A session's ACL entries from their stored JSON (a snapshot's ``acl`` fields), in
    entry id order."""
    entries = [AclEntry.from_json(fastjson.loads(raw)) for raw in stored]
    entries.sort(key=lambda e: e.entry_id)
    return entries


def acl_roles(entries: Iterable[AclEntry], principal: Principal, now: float) -> frozenset[Role]:
    """The roles the live entries of a session's ACL give ``principal``."""
    return subject_roles(entries, principal.subject, now)


def subject_roles(entries: Iterable[AclEntry], subject: str, now: float) -> frozenset[Role]:
    """The roles the live entries of a session's ACL give principal ``subject``."""
    roles: set[Role] = set()
    for entry in entries:
        if entry.principal_id == subject and entry.live(now):
            roles |= entry.roles
    return frozenset(roles)


def effective(entries: Iterable[AclEntry], principal: Principal, now: float) -> frozenset[Role]:
    """``principal``'s roles on a session: its live ACL entries' roles and its credential's
    tenant roles (their permissions are then bounded by its scopes: :func:`permissions_of`)."""
    return acl_roles(entries, principal, now) | tenant_roles(principal)


@dataclass(frozen=True, slots=True)
class Authority:
    """What an operation that commits later (a queued prompt) was accepted with: its
    author's subject, its credential's tenant roles and scopes as they were then (never
    the credential itself). At commit, :meth:`allows` decides by the same rule as the front
    (:func:`effective`, :func:`permissions_of`) with the session's ACL as it is then, so a
    revoke in between fences the operation."""

    subject: str
    roles: frozenset[Role]
    scopes: frozenset[str]

    @classmethod
    def of(cls, principal: Principal) -> Authority:
        return cls(principal.subject, tenant_roles(principal), frozenset(principal.scopes))

    def allows(self, entries: Iterable[AclEntry], permission: Permission, now: float) -> bool:
        roles = subject_roles(entries, self.subject, now) | self.roles
        return permission in _granted(roles) & bound_of(self.scopes)

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "roles": sorted(self.roles), "scopes": sorted(self.scopes)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Authority:
        """An authority as :meth:`to_json` wrote it (a front's command: trusted)."""
        return cls(
            str(data["subject"]), parse_roles(data["roles"]), frozenset(map(str, data["scopes"]))
        )


def owners_left(entries: Iterable[AclEntry], removed: str, now: float) -> bool:
    """Whether an ACL keeps a live owner once entry ``removed`` goes."""
    return any(e.entry_id != removed and Role.OWNER in e.roles and e.live(now) for e in entries)


def rfc3339(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")


def parse_time(text: str) -> float:
    """An RFC 3339 timestamp as Unix time; ``ValueError`` unless it is one with a zone."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (RFC 3339 needs one)")
    return parsed.timestamp()
