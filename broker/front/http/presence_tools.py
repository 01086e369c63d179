"""A session's presence for REST and the session tools: who is attached now.

Read from the presence hashes the fronts keep (``store/presence.py``), so it answers for
every front node at once; the session must exist (``session_not_found`` otherwise).
"""

from __future__ import annotations

from typing import cast

from ...protocol.presence import sorted_entries
from ...store.presence import PresenceStore
from .session_tools import SessionTools
from .tool_outputs import Participant, SessionPresence


class PresenceTools:
    """The presence part of the session tools."""

    def __init__(self, tools: SessionTools) -> None:
        self.tools = tools
        self.store = PresenceStore(tools.redis, tools.settings.presence_ttl)

    async def present(self, tenant: str, session_id: str) -> SessionPresence:
        """The session's presence now (privacy-filtered entries, in a stable order)."""
        await self.tools.snapshot(tenant, session_id)
        read = await self.store.read(tenant, session_id)
        entries = cast(list[Participant], sorted_entries(list(read.entries.values())))
        return {
            "sessionId": session_id,
            "presenceRevision": str(read.revision),
            "participants": entries,
        }


def presence_lines(present: SessionPresence) -> list[str]:
    """Presence for a model: a line per attachment (who, roles, state, last active)."""
    lines = [f"presence revision {present['presenceRevision']}"]
    for item in present["participants"]:
        name = item.get("displayName") or "(no name shared)"
        lines.append(
            f"{item['participantId']}  {name}  {','.join(item['roles'])}  {item['state']}"
            f"  last active {item['lastActiveAt']}  window {item['attachmentId']}"
        )
    if len(lines) == 1:
        lines.append("nobody is attached")
    return lines
