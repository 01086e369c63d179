"""A session the agent host lets go while it brings it back (its agent's first updates
refused by a full store: the stopper drops it) still exists: a prompt on it meets the
store's refusal, never "session not found"."""

from __future__ import annotations

from typing import Any, cast

import pytest

from broker.protocol.jsonrpc import JsonObject
from broker.store.log_errors import StoreFull
from workers.agent_host.restorer import SessionRestorer
from workers.agent_host.sessions import HeldSessions


class _DroppedThenFull(SessionRestorer):
    """A restore that holds the session, then sees it dropped (its updates refused); the
    next one is refused by the full store (the lease's write)."""

    def __init__(self, sessions: HeldSessions) -> None:
        super().__init__(*cast(Any, (None, None, None, sessions, None)))
        self.restores = 0

    async def _restore(self, tenant: str, session_id: str, params: JsonObject) -> JsonObject:
        self.restores += 1
        if self.restores > 1:
            raise StoreFull("OOM command not allowed when used memory > 'maxmemory'.")
        held = self.sessions.hold(tenant, session_id, cast(Any, object()), "agent-sid")
        self.sessions.drop(held)  # as SessionStopper.fail does when the store refuses
        return {}


async def test_a_session_dropped_as_it_is_brought_back_is_refused_as_the_store_refuses() -> None:
    restorer = _DroppedThenFull(HeldSessions())
    with pytest.raises(StoreFull):
        await restorer.require("t", "sess_1", {})
    assert restorer.restores == 2
