"""Who may answer a session's pending interactions: one decision for ACP, REST and the tools.

Today an answer needs the credential's ``write`` scope in the session's tenant (the tenant
is checked where the session is looked up). Session roles (``approver``, ``owner``), when
the broker has them, decide here too: every path that claims, releases or answers an
interaction asks :func:`may_answer` and nothing else.
"""

from __future__ import annotations

from ..auth.principal import Principal, Scope

API_SCOPE = Scope.WRITE
"""The scope a REST or tool caller's credential needs to answer (the rule of
:func:`may_answer`, where only the credential's scope is known)."""


def may_answer(principal: Principal | None, session_id: str) -> bool:
    """Whether ``principal`` may claim, release or answer ``session_id``'s interactions."""
    del session_id  # the roles' decision will be per session
    return principal is not None and principal.may(Scope.WRITE)
