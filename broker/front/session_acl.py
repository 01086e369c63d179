"""Session roles on the front: who may do what to a session, and the owners' grants.

A principal's **effective roles** on a session (:meth:`SessionAcl.effective_roles`: the one
function every interface asks) are the roles its live entries in the session's ACL give it
and the tenant roles its credential names (a token's roles, a JWT's roles claim; none named:
``auth.roles.default_roles``); what they allow is bounded by the credential's scopes
(``auth.roles.permissions_of``). :meth:`SessionAcl.require` refuses an operation whose
permission they lack (``errors.access.forbidden``), changing nothing.

The ACL is part of the session's log: each grant or revoke is a ``session_access`` event
(so it replays, fans out and survives what the log survives), and the append that writes
it keeps the entries in the session's snapshot hash (``acl:<entryId>`` fields:
``store.events``), which any front reads with the snapshot. So a revoke is refused on
every front from the next operation on. The principal that makes a session is its first
``owner`` (:meth:`SessionAcl.record_owner`).

Permissions the credential's tenant roles already give need no read (most operations of
most clients): only a credential whose own roles fall short reads the session's ACL.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..auth.principal import Principal, anonymous
from ..auth.roles import (
    AclEntry,
    Permission,
    Role,
    acl_entries,
    effective,
    entry_id_for,
    grant_entry,
    owners_left,
    parse_time,
    permissions_of,
    tenant_roles,
)
from ..errors.access import forbidden, last_owner, unknown_entry
from ..model.events import EventType, JsonObject
from ..protocol.jsonrpc import invalid_params
from ..protocol.operations import activity_id
from ..store.events import LogEvent, SessionSnapshot
from ..store.log import SessionLog, SessionMissing

ANONYMOUS = anonymous("").subject

OPERATION_PERMISSIONS: Mapping[str, Permission] = {
    "session/load": Permission.READ,
    "session/resume": Permission.READ,
    "session/prompt": Permission.WRITE,
    "session/fork": Permission.WRITE,
    "session/set_title": Permission.WRITE,
    "session/set_mode": Permission.CONTROL,
    "session/set_config_option": Permission.CONTROL,
    "session/cancel": Permission.CONTROL,
    # The broker's close is a detach (the session stops being active on the connection;
    # it lives on for everyone else: docs/protocol.md), not the draft's close of the session.
    "session/close": Permission.READ,
    "session/delete": Permission.ADMIN,
    "interaction/list": Permission.READ,
    "interaction/claim": Permission.APPROVE,
    "interaction/release": Permission.APPROVE,
    "interaction/respond": Permission.APPROVE,
    "session/attach": Permission.READ,
    "session/ready": Permission.READ,
    "session/detach": Permission.READ,
    "session_access/list": Permission.ADMIN,
    "session_access/grant": Permission.ADMIN,
    "session_access/revoke": Permission.ADMIN,
}
"""The permission each ACP method on a session needs (REST and the tools ask for the same
ones by operation: docs/shared-sessions.md has the table)."""

Fence = Callable[[LogEvent], Awaitable[bool]]
"""Whether an event took ``session.read`` from a follower of the session (a stream, a
tool-driven turn): it stops following after it. :meth:`SessionAcl.lost_read`, bound to the
follower's principal and the session."""


def needed_permission(method: str, params: Mapping[str, Any]) -> Permission | None:
    """The permission ``method`` needs on its session (None: none, or not one on a session).
    A cancel naming an activity needs only ``session.write``, so that a prompt's author may
    withdraw it while it is queued (the host withdraws a queued prompt for its author only;
    no standard role holds write without control)."""
    if method == "session/cancel" and activity_id(dict(params)) is not None:
        return Permission.WRITE
    return OPERATION_PERMISSIONS.get(method)


@dataclass(frozen=True, slots=True)
class AclView:
    """A session's ACL as its snapshot holds it."""

    entries: list[AclEntry]
    revision: int

    def to_json(self) -> JsonObject:
        return {
            "aclRevision": str(self.revision),
            "entries": [entry.to_json() for entry in self.entries],
        }


class SessionAcl:
    """Reads and changes sessions' ACLs, and decides from them (no state of its own: each
    part of a front that decides holds one)."""

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    async def view(self, tenant: str, session_id: str) -> AclView:
        """The session's ACL (``SessionMissing`` if there is no such session)."""
        return acl_of(await self.log.snapshot(tenant, session_id))

    async def effective_roles(self, principal: Principal, session_id: str) -> frozenset[Role]:
        """``principal``'s roles on ``session_id`` (in its tenant): its live ACL entries' and
        its credential's tenant roles. A session that does not exist gives the latter."""
        try:
            acl = await self.view(principal.tenant, session_id)
        except SessionMissing:
            return tenant_roles(principal)
        return effective(acl.entries, principal, time.time())

    async def allows(self, principal: Principal, session_id: str, permission: Permission) -> bool:
        """Whether ``principal`` holds ``permission`` on ``session_id`` now. A session that
        does not exist (or is deleted) is not refused here: its operation then answers
        ``session_not_found``, exactly as for another tenant's session, so that a refusal
        never tells that a session exists."""
        if permission in permissions_of(tenant_roles(principal), principal):
            return True  # the credential alone allows it: no read
        try:
            snapshot = await self.log.snapshot(principal.tenant, session_id)
        except SessionMissing:
            return True
        if snapshot.deleted:
            return True
        roles = effective(acl_of(snapshot).entries, principal, time.time())
        return permission in permissions_of(roles, principal)

    async def lost_read(self, principal: Principal, session_id: str, event: LogEvent) -> bool:
        """Whether ``event`` is a revoke that took ``session.read`` on ``session_id`` from
        ``principal``, who does not hold it now: what follows it is no longer the
        principal's to see. Read again, not taken from the event alone, because a grant may
        have given it back since (a revoke in a history, or one a new grant followed)."""
        if event.type != EventType.SESSION_ACCESS:
            return False
        if not revoke_takes(event.body, principal, Permission.READ):
            return False
        return not await self.allows(principal, session_id, Permission.READ)

    async def require(
        self, principal: Principal, session_id: str, permission: Permission, operation: str
    ) -> None:
        """Refuse ``operation`` (``forbidden``, -32600) unless ``principal`` holds
        ``permission`` on ``session_id``."""
        if not await self.allows(principal, session_id, permission):
            raise forbidden(permission, operation)

    # -- changes --------------------------------------------------------------------------

    async def record_owner(self, principal: Principal, session_id: str) -> None:
        """``principal`` made ``session_id``: it is the session's first owner. Not with
        authentication off: everyone is then the one anonymous principal, holding every role
        on every session (an entry would name nobody)."""
        if principal.subject == ANONYMOUS:
            return
        entry = grant_entry(principal.subject, [Role.OWNER])
        await self._append(principal.tenant, session_id, "grant", entry, revision=1)

    async def grant(self, principal: Principal, params: Mapping[str, Any]) -> JsonObject:
        """``session_access/grant`` (the caller's ``session.admin`` checked already): the
        subject's entry made or replaced; answers the entry and the new revision."""
        session_id = str(params["sessionId"])
        entry = grant_params(params)
        acl = await self.view(principal.tenant, session_id)
        if Role.OWNER not in entry.roles and not owners_left(
            acl.entries, entry.entry_id, time.time()
        ):
            raise last_owner(entry.entry_id)  # a grant replacing the last owner's entry
        revision = acl.revision + 1
        await self._append(principal.tenant, session_id, "grant", entry, revision)
        return {"entry": entry.to_json(), "aclRevision": str(revision)}

    async def revoke(self, principal: Principal, params: Mapping[str, Any]) -> JsonObject:
        """``session_access/revoke``: the entry removed, unless it is the last owner's."""
        session_id = str(params["sessionId"])
        entry_id = params.get("entryId")
        if not isinstance(entry_id, str) or not entry_id:
            raise invalid_params("entryId must be a non-empty string")
        acl = await self.view(principal.tenant, session_id)
        entry = next((e for e in acl.entries if e.entry_id == entry_id), None)
        if entry is None:
            raise unknown_entry(entry_id)
        if Role.OWNER in entry.roles and not owners_left(acl.entries, entry_id, time.time()):
            raise last_owner(entry_id)
        revision = acl.revision + 1
        await self._append(principal.tenant, session_id, "revoke", entry, revision)
        return {"entryId": entry_id, "aclRevision": str(revision)}

    async def _append(
        self, tenant: str, session_id: str, change: str, entry: AclEntry, revision: int
    ) -> None:
        body: JsonObject = {
            "type": EventType.SESSION_ACCESS,
            "change": change,
            "entryId": entry.entry_id,
            "aclRevision": str(revision),
        }
        if change == "grant":
            body["entry"] = entry.to_json()
        await self.log.append(tenant, session_id, body)


def revoke_takes(body: Mapping[str, Any], principal: Principal | None, need: Permission) -> bool:
    """Whether ``body`` (a ``session_access`` event) revokes ``principal``'s entry, and
    ``need`` with it: a subject has one entry on a session, so once it goes, the roles of
    its credential are all the principal holds there (no read needed to decide)."""
    if principal is None or body.get("change") != "revoke":
        return False
    if body.get("entryId") != entry_id_for(principal.subject):
        return False
    return need not in permissions_of(tenant_roles(principal), principal)


def acl_of(snapshot: SessionSnapshot) -> AclView:
    """The ACL a session's snapshot holds."""
    return AclView(acl_entries(snapshot.acl.values()), snapshot.acl_revision)


def grant_params(params: Mapping[str, Any]) -> AclEntry:
    """The entry a grant's params ask for (-32602 for bad ones): ``subject`` ``{type:
    "principal", principalId}``, a non-empty ``roles`` list, an optional ``expiresAt``
    (RFC 3339; null is invalid, as the draft says)."""
    subject = params.get("subject")
    if not isinstance(subject, dict) or subject.get("type") != "principal":
        raise invalid_params('subject must be {"type": "principal", "principalId": …}')
    principal_id = subject.get("principalId")
    roles = params.get("roles")
    if not isinstance(principal_id, str) or not principal_id:
        raise invalid_params("subject.principalId must be a non-empty string")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise invalid_params("roles must be a list of role names")
    expires: float | None = None
    if "expiresAt" in params:
        raw = params["expiresAt"]
        if not isinstance(raw, str):
            raise invalid_params("expiresAt must be an RFC 3339 timestamp (null is invalid)")
        try:
            expires = parse_time(raw)
        except ValueError as exc:
            raise invalid_params(f"expiresAt: {exc}") from None
    try:
        return grant_entry(principal_id, roles, expires)
    except ValueError as exc:
        raise invalid_params(str(exc)) from None
