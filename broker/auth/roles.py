"""Session roles and permissions: the vocabulary of the ACP Remote security draft.

A role is a bundle of permissions (``rfds-remote-security-and-identity``): an ``observer``
reads, a ``controller`` also prompts and steers, an ``approver`` also answers the agent's
questions, an ``owner`` may do everything, sharing the session included. Authorization asks
for a :class:`Permission`, never for a role's name: a principal holding several roles holds
the union of their permissions, bounded by what its credential's scopes allow.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

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
    Scope.WRITE: frozenset({Permission.WRITE, Permission.CONTROL, Permission.APPROVE}),
    Scope.ADMIN: frozenset(Permission),
}
"""The permissions each credential scope allows at most (a scope is an upper bound: it
grants nothing on a session by itself)."""


def scope_bound(principal: Principal) -> frozenset[Permission]:
    """Every permission ``principal``'s scopes allow."""
    allowed: set[Permission] = set()
    for scope in principal.scopes:
        allowed |= SCOPE_BOUNDS.get(scope, frozenset())
    return frozenset(allowed)


def permissions_of(roles: Iterable[Role], principal: Principal) -> frozenset[Permission]:
    """The permissions ``roles`` grant ``principal``, bounded by its credential's scopes."""
    granted: set[Permission] = set()
    for role in roles:
        granted |= BUNDLES[role]
    return frozenset(granted) & scope_bound(principal)


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
