"""Rebuild the session index from the logs alone.

What ``acp-broker rebuild-index`` runs. Every session's log is folded (the pure
:func:`broker.store.events.fold`) and
projected over whatever the index holds; rows of sessions that no longer have
a log are removed. The index stays readable throughout.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from .archive import ArchiveStore
from .boundary import translated
from .client import Commands, Store, commands
from .events import LogEvent, fold
from .index import SessionIndex, members_of
from .keys import PREFIX, SessionKeys, TenantKeys
from .log import SessionLog

log = logging.getLogger(__name__)


@translated
async def find_sessions(store: Store) -> dict[str, set[str]]:
    """Every session, by tenant (a SCAN: for rebuilds, not for serving). Sessions are found
    by their snapshot, which an archived session keeps while its log is archived."""
    found: dict[str, set[str]] = defaultdict(set)
    async for key in commands(store).scan_iter(match=f"{PREFIX}:{{*}}:t:*:s:*:snap", count=1000):
        # acpb:{tag}:t:<tenant>:s:<session>:snap
        _, _, rest = key.partition("}:t:")
        tenant, _, rest = rest.partition(":s:")
        found[tenant].add(rest.rsplit(":snap", 1)[0])
    return found


@translated
async def rebuild_index(redis: Store, archive: ArchiveStore | None = None) -> dict[str, int]:
    """Rebuild every tenant's index from the logs (an archived one read from ``archive``);
    returns how many sessions per tenant."""
    session_log = SessionLog(redis, archive=archive)
    index = SessionIndex(redis)
    counts: dict[str, int] = {}
    for tenant, sessions in (await find_sessions(redis)).items():
        keys = TenantKeys(tenant)
        expected: dict[str, set[str]] = defaultdict(set)
        for session_id in sessions:
            events = await session_log.read(tenant, session_id)
            await _mark_hot(commands(redis), tenant, session_id, events)
            snapshot = fold(tenant, session_id, events)
            if snapshot is not None:
                await index.project(snapshot, force=True, announce=False)
                for name, member in members_of(snapshot).items():
                    expected[keys.index(name)].add(member)
        try:
            await _remove_orphans(commands(redis), index, tenant, sessions)
            await _sweep_listings(commands(redis), keys, expected)
        finally:
            # Fronts drop their cached pages of the tenant: once for all its sessions.
            await index.announcer.announce((tenant,))
        counts[tenant] = len(sessions)
    return counts


async def _mark_hot(redis: Commands, tenant: str, session_id: str, events: list[LogEvent]) -> None:
    """Put a session whose log is in Redis in its partition's hot set, if it is not there
    (sessions logged before the archive existed): the archiving role finds it there."""
    keys = SessionKeys(tenant, session_id)
    if events and await redis.hget(keys.snapshot, "archived") is None:
        await redis.zadd(keys.hot, {keys.member: events[-1].ts}, nx=True)


async def _remove_orphans(
    redis: Commands, index: SessionIndex, tenant: str, live: set[str]
) -> None:
    """Rows and versions of sessions that no longer have a log."""
    keys = TenantKeys(tenant)
    known = set(await redis.hkeys(keys.rows)) | set(await redis.hkeys(keys.versions))
    for session_id in known - live:
        await index.remove(tenant, session_id)
        log.info("removed index row of vanished session %s", session_id)


async def _sweep_listings(redis: Commands, keys: TenantKeys, expected: dict[str, set[str]]) -> None:
    """Remove every listing entry that no session's snapshot accounts for."""
    async for listing in redis.scan_iter(match=keys.index("*"), count=1000):
        stray = set(await redis.zrange(listing, 0, -1)) - expected.get(listing, set())
        if stray:
            await redis.zrem(listing, *stray)
            log.info("removed %d stray entries from %s", len(stray), listing)
