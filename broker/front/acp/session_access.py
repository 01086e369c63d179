"""``session_access/list``, ``grant`` and ``revoke``: the ACP Remote draft's session ACL
methods, for any ACP v1 or v2 client (the draft's names; its ``sessionEpoch`` and expected
revisions are not asked for). Each needs ``session.admin`` on the session (checked with
every method's permission: ``AcpMethods.authorize``); the session need not be active on
the connection. A grant or revoke is a ``session_access`` event in the session's log
(:mod:`..session_acl`).
"""

from __future__ import annotations

from typing import Any, Protocol

from ...protocol.commands import AgentGateway
from ...protocol.jsonrpc import JsonObject, Request, session_not_found
from ...store.log import SessionMissing
from ..session_acl import SessionAcl
from .connection import ClientConnection
from .params import session_id_of


class AclMethods(Protocol):
    """What these methods need of the connection's ACP methods (``AcpMethods``)."""

    acl: SessionAcl
    host: AgentGateway


async def session_access_request(
    methods: AclMethods, conn: ClientConnection, request: Request
) -> Any:
    """Any of the three methods (the caller's ``session.admin`` checked already)."""
    session_id = session_id_of(request.params)
    principal = conn.principal
    assert principal is not None  # authorize refused an unauthenticated caller
    action = request.method.removeprefix("session_access/")
    try:
        if action == "list":
            view = await methods.acl.view(conn.tenant, session_id)
            return view.to_json()
        params: JsonObject = {**request.params, "sessionId": session_id}
        if action == "grant":
            return await methods.acl.grant(principal, params)
        revoked = await methods.acl.revoke(principal, params)
        await methods.host.fence(conn.tenant, session_id)  # claims it took authority from
        return revoked
    except SessionMissing:
        raise session_not_found(session_id) from None


SESSION_ACCESS_METHODS = {
    f"session_access/{action}": session_access_request for action in ("list", "grant", "revoke")
}
"""The methods, as the v1 and v2 surfaces list them."""
