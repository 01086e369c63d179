"""Waits on the projectors, for tests that must see the index at rest."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.store.keys import SessionKeys
from workers.projector.worker import GROUP

from .client import LOADED_WAIT, wait_for


async def until_consumed(store: Any, feeds: Iterable[str], timeout: float = LOADED_WAIT) -> None:
    """Wait (bounded) until the projectors have read every notice of ``feeds`` and
    acknowledged it. A projector acknowledges a batch only once it has applied all of it
    (with the next read), so nothing read from these feeds is still on its way to the index:
    a version already current is not enough, since a batch a front's own write overtook
    may still be retrying its projection."""
    wanted = sorted(set(feeds))

    async def consumed() -> bool:
        for feed in wanted:
            groups = await store.xinfo_groups(feed)
            group = next((g for g in groups if g["name"] == GROUP), None)
            if group is None or group["lag"] != 0 or group["pending"] != 0:
                return False
        return True

    await wait_for(consumed, timeout, "the projectors to consume and acknowledge the feeds")


def feeds_of(tenant: str, session_ids: Iterable[str]) -> set[str]:
    """The change feeds the sessions' notices go to."""
    return {SessionKeys(tenant, session_id).feed for session_id in session_ids}
