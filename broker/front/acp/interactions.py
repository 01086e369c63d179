"""``interaction/list``, ``claim``, ``release`` and ``respond``: the ACP Remote draft's
durable pending interactions, for clients that negotiated the draft (``capabilities.remote``
at ``initialize``); others get -32601, and answer the agent's requests as before.

The session must be active on the connection (loaded, resumed or made there). The host
holding the session runs each change as a compare-and-set and logs it before answering
(``workers.agent_host.interactions``); a session no host holds has no pending interaction.
"""

from __future__ import annotations

from typing import Any, Protocol

from ...auth.roles import Authority
from ...errors.interactions import not_allowed, unknown_interaction
from ...protocol.commands import AgentGateway
from ...protocol.interactions import attachment_id
from ...protocol.jsonrpc import METHOD_NOT_FOUND, JsonObject, Request, RpcError
from ...protocol.operations import negotiates_remote
from ..approval import may_answer
from ..session_acl import SessionAcl
from .connection import ClientConnection


class SessionMethods(Protocol):
    """What these methods need of the connection's ACP methods (``AcpMethods``)."""

    host: AgentGateway
    acl: SessionAcl

    def active_session(self, conn: ClientConnection, params: JsonObject) -> str: ...


CHANGES = ("claim", "release", "respond")


async def interaction_request(
    methods: SessionMethods, conn: ClientConnection, request: Request
) -> Any:
    """Any of the four methods: checked here, run at the session's host."""
    if not negotiates_remote(conn.client_capabilities):
        raise RpcError(
            METHOD_NOT_FOUND,
            f"Method not found: {request.method} (negotiate capabilities.remote at initialize)",
        )
    session_id = methods.active_session(conn, request.params)
    action = request.method.removeprefix("interaction/")
    if action in CHANGES and not await may_answer(methods.acl, conn.principal, session_id):
        raise not_allowed()
    principal = conn.principal.subject if conn.principal is not None else ""
    params: JsonObject = {k: v for k, v in request.params.items() if k != "sessionId"}
    # Until attachments are made by session/attach, a connection is its own attachment.
    params["attachmentId"] = attachment_id(session_id, conn.id)
    authority = Authority.of(conn.principal) if conn.principal is not None else None
    reply = await methods.host.interact(
        conn.tenant, session_id, action, params, principal, authority
    )
    if action == "list":
        return {"interactions": reply.get("interactions", [])}
    if "interaction" not in reply:  # no host holds the session: nothing is pending
        raise unknown_interaction(str(params.get("interactionId") or ""))
    return reply


INTERACTION_METHODS = {
    f"interaction/{action}": interaction_request for action in ("list", *CHANGES)
}
"""The methods, as the v1 and v2 surfaces list them."""
