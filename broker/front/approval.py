"""Who may answer a session's pending interactions: one decision for ACP, REST and the tools.

An answer (a claim, a release, a response) needs ``session.approve`` on the session: the
principal's effective roles there (``approver`` or ``owner``, from the session's ACL or the
credential's tenant roles: :class:`~.session_acl.SessionAcl`), bounded by its scopes. Every
path that claims, releases or answers an interaction asks :func:`may_answer` and nothing else.
"""

from __future__ import annotations

from ..auth.principal import Principal, Scope
from ..auth.roles import Permission
from .session_acl import SessionAcl

API_SCOPE = Scope.WRITE
"""The scope a REST or tool caller's credential needs to answer at all (its roles on the
session are then asked, as :func:`may_answer` asks them)."""


async def may_answer(acl: SessionAcl, principal: Principal | None, session_id: str) -> bool:
    """Whether ``principal`` may claim, release or answer ``session_id``'s interactions."""
    if principal is None:
        return False
    return await acl.allows(principal, session_id, Permission.APPROVE)
