"""Who is attached to a session, readable fast: one hash per session, an entry per attachment.

Each front writes the entries of the attachments its connections hold (the field is the
attachment id, the value the entry's JSON with ``expiresAt``, Unix ms) and refreshes them
while they last; an entry whose ``expiresAt`` has passed is no longer read, and the next
sweep removes it (its front died: nobody refreshed it). Field ``rev`` counts the changes
(the presence revision). The key expires with its longest-lived entry, so a session whose
fronts all died leaves nothing behind. The key carries the session's partition tag: one
slot with its other keys.

Presence is advisory: nothing reads it to authorize anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .. import fastjson
from ..model.events import JsonObject
from .boundary import port
from .client import Store, commands
from .keys import session_keys

REVISION_FIELD = "rev"
_REMOVE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local revision = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
if redis.call('HLEN', KEYS[1]) == 1 then
  redis.call('DEL', KEYS[1])
end
return revision
"""
"""Take an entry out and count the change; the last one out deletes the hash (nothing of an
empty session's presence stays in the store)."""
EXPIRES = "expiresAt"
"""The entry's own field: when it lapses unless refreshed (Unix ms; never shown)."""


def presence_key(tenant: str, session_id: str) -> str:
    """The session's presence hash (in the slot of the session's other keys)."""
    return f"{session_keys(tenant, session_id).snapshot.removesuffix(':snap')}:presence"


def _extend(pipe: Any, key: str, ttl_ms: int) -> None:
    """Make the hash live ``ttl_ms`` more, never less than it would (another front's
    entries may live longer): a new hash gets the TTL, an old one only a longer one."""
    pipe.pexpire(key, ttl_ms, nx=True)
    pipe.pexpire(key, ttl_ms, gt=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class PresenceRead:
    """A session's presence as read: its revision and its live entries, by attachment id."""

    revision: int
    entries: dict[str, JsonObject]
    expired: dict[str, JsonObject]
    """The entries that lapsed (their front stopped refreshing them), by attachment id."""


@port
class PresenceStore:
    """The presence hashes (see the module's docstring)."""

    def __init__(self, redis: Store, ttl: float) -> None:
        self.redis = redis
        self.ttl_ms = int(ttl * 1000)
        self._remove = commands(redis).register_script(_REMOVE)

    async def put(
        self, tenant: str, session_id: str, entries: dict[str, JsonObject], changes: int = 1
    ) -> int:
        """Write (or refresh) ``entries`` by attachment id, each good for the TTL from now;
        returns the revision after the write, which counts ``changes`` changes (the
        revisions before it, down to ``changes - 1`` less, are the earlier ones')."""
        key = presence_key(tenant, session_id)
        expires = _now_ms() + self.ttl_ms
        mapping = {
            attachment: fastjson.dumps({**entry, EXPIRES: expires})
            for attachment, entry in entries.items()
        }
        async with commands(self.redis).pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=mapping)
            # A hash made again (its last entry left) counts on from its time, in micro-
            # seconds: a revision never goes back, so a client's older snapshot stays older.
            pipe.hsetnx(key, REVISION_FIELD, _now_ms() * 1000)
            pipe.hincrby(key, REVISION_FIELD, changes)
            _extend(pipe, key, self.ttl_ms)
            replies = await pipe.execute()
        return int(replies[2])

    async def refresh(self, tenant: str, session_id: str, entries: dict[str, JsonObject]) -> None:
        """Push ``entries``' expiry a TTL on, changing nothing else (no new revision)."""
        key = presence_key(tenant, session_id)
        expires = _now_ms() + self.ttl_ms
        mapping = {a: fastjson.dumps({**e, EXPIRES: expires}) for a, e in entries.items()}
        async with commands(self.redis).pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=mapping)
            _extend(pipe, key, self.ttl_ms)
            await pipe.execute()

    async def remove(self, tenant: str, session_id: str, attachment: str) -> int | None:
        """Take an attachment out; the revision after it, or None when it was not there (a
        detach already done, or another front's sweep took it)."""
        key = presence_key(tenant, session_id)
        revision = int(await self._remove(keys=[key], args=[attachment, REVISION_FIELD]))
        return None if revision < 0 else revision

    async def read(self, tenant: str, session_id: str) -> PresenceRead:
        """The live entries (without their expiry) and the lapsed ones' ids."""
        raw = await commands(self.redis).hgetall(presence_key(tenant, session_id))
        now = _now_ms()
        revision: int = 0
        entries: dict[str, JsonObject] = {}
        expired: dict[str, JsonObject] = {}
        for name, value in raw.items():
            field = name.decode() if isinstance(name, bytes) else str(name)
            if field == REVISION_FIELD:
                revision = int(value)
                continue
            entry = fastjson.loads(value)
            if not isinstance(entry, dict):
                continue
            if int(entry.pop(EXPIRES, 0)) < now:
                expired[field] = entry
            else:
                entries[field] = entry
        return PresenceRead(revision, entries, expired)
