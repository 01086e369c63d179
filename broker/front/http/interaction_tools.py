"""A session's pending interactions for REST and the session tools: list them, answer one.

The host holding the session keeps them (``workers.agent_host.interactions``); an answer
from here claims and resolves the interaction in one compare-and-set (with
``expectedRevision``, only at that revision), logged before the agent hears it. Who may
answer: :func:`~broker.front.approval.may_answer`'s rule, checked as the caller's scope.
The caller answers as its principal (:class:`~broker.auth.principal.Principal`): the
interaction's ``resolvedBy`` is that principal's participant, as for an ACP connection with
the same credential.
"""

from __future__ import annotations

from ...auth.principal import Principal
from ...errors.interactions import unknown_interaction
from ...protocol.interactions import summary
from ...store.events import JsonObject
from .session_tools import SessionTools


class InteractionTools:
    """The interactions part of the session tools."""

    def __init__(self, tools: SessionTools) -> None:
        self.tools = tools

    async def pending(self, caller: Principal, session_id: str) -> list[JsonObject]:
        """The session's open and claimed interactions (none when no host holds it)."""
        tenant = caller.tenant
        await self.tools.live(tenant, session_id)
        reply = await self.tools.agents.interact(tenant, session_id, "list", {}, caller.subject)
        return [summary(view) for view in reply.get("interactions", [])]

    async def respond(
        self,
        caller: Principal,
        session_id: str,
        interaction_id: str,
        response: JsonObject,
        expected: str | None,
    ) -> JsonObject:
        """Answer an interaction (``revision_conflict`` when it is no longer open, or is
        claimed by another, or not at ``expected``); the interaction as it is then,
        ``resolvedBy`` the caller's participant."""
        tenant = caller.tenant
        await self.tools.live(tenant, session_id)
        params: JsonObject = {"interactionId": interaction_id, "response": response}
        if expected is not None:
            params["expectedRevision"] = expected
        reply = await self.tools.agents.interact(
            tenant, session_id, "respond", params, caller.subject
        )
        if "interaction" not in reply:  # no host holds the session: nothing is pending
            raise unknown_interaction(interaction_id)
        return summary(reply["interaction"])
