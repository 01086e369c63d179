"""What the archiver keeps track of, per partition: the sessions whose log is in Redis
(the *hot* set, scored by their last append) and the deleted sessions not purged yet
(scored by their deletion), both in ms; and what it drops of a purged session. What it
does with them is :mod:`workers.projector.archiving`'s; the archive itself is
:mod:`.archive`'s."""

from __future__ import annotations

import time

from .boundary import port
from .client import Store, commands
from .keys import SessionKeys, deleted_key, hot_key, split_member


@port
class RetentionSets:
    """The hot and deleted sets of the partitions, and a purged session's keys."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)

    async def idle(self, partition: int, older_than: float) -> list[tuple[str, str]]:
        """Sessions (``(tenant, session id)``) of ``partition`` whose log is in Redis and
        got no append for ``older_than`` seconds."""
        return await self._due(hot_key(partition), older_than)

    async def deleted(self, partition: int, older_than: float) -> list[tuple[str, str]]:
        """Sessions of ``partition`` deleted over ``older_than`` seconds ago, not purged yet."""
        return await self._due(deleted_key(partition), older_than)

    async def _due(self, key: str, older_than: float) -> list[tuple[str, str]]:
        cutoff = int((time.time() - older_than) * 1000)
        members = await self.redis.zrangebyscore(key, "-inf", cutoff)
        return [split_member(str(member)) for member in members]

    async def cooled(self, tenant: str, session_id: str) -> None:
        """The session's log left Redis (or the session did): out of the hot set."""
        keys = SessionKeys(tenant, session_id)
        await self.redis.zrem(keys.hot, keys.member)

    async def purged(self, tenant: str, session_id: str) -> None:
        """The deleted session is purged (or was not deleted): out of the deleted set."""
        keys = SessionKeys(tenant, session_id)
        await self.redis.zrem(keys.deleted, keys.member)

    async def snapshot_field(self, tenant: str, session_id: str, field: str) -> str | None:
        """One field of the session's snapshot (``status``, ``seq`` …); None if unset."""
        value = await self.redis.hget(SessionKeys(tenant, session_id).snapshot, field)
        return None if value is None else str(value)

    async def drop(self, tenant: str, session_id: str) -> None:
        """Delete what Redis holds of the session (log, metadata, lease, snapshot) and take
        it out of the hot set (its index row and its archive are dropped apart)."""
        keys = SessionKeys(tenant, session_id)
        await self.redis.delete(keys.log, keys.meta, keys.lease, keys.snapshot)
        await self.redis.zrem(keys.hot, keys.member)
