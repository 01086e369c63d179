"""Archived session logs: read back from the archive store (the last few kept), restored
into Redis, and trimmed from Redis once archived."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from redis.exceptions import ResponseError

from .appends import LogAppender, lua_script
from .archive import ArchiveCorrupt, ArchivedLog, ArchiveStore, decode, entries_between
from .client import Store, commands
from .events import window_fields
from .keys import SessionKeys
from .log_errors import ArchiveUnavailable, SessionMissing, append_error

RESTORE_CHUNK = 1000
"""Events per restore script call: a long log comes back in parts, each one short."""


_CACHED_ARCHIVES = 8


class ArchivedLogs:
    """The logs that are (or were) in the archive store, as this process sees them."""

    def __init__(self, redis: Store, archive: ArchiveStore | None, appender: LogAppender) -> None:
        self.redis = commands(redis)
        self.archive = archive
        self.appender = appender  # whose script runner the restore and trim scripts share
        self._archives: dict[tuple[str, str, str], ArchivedLog] = {}
        self._restore = commands(redis).register_script(lua_script("restore.lua"))
        self._trim = commands(redis).register_script(lua_script("archive_trim.lua"))

    async def archived(self, tenant: str, session_id: str) -> ArchivedLog:
        """The session's archived log, checked whole against its snapshot. Archived logs
        do not change while archived, so the last few read are kept, by ``gen``."""
        keys = SessionKeys(tenant, session_id)
        archived, gen, epoch = await self.redis.hmget(keys.snapshot, "archived", "gen", "epoch")
        if epoch is None:
            raise SessionMissing(session_id)
        cache_key = (tenant, session_id, str(gen))
        found = self._archives.get(cache_key)
        if found is not None:
            return found
        if self.archive is None:
            raise ArchiveUnavailable(
                f"session {session_id}'s log is archived and no archive store is configured"
            )
        blob = await self.archive.get(tenant, session_id)
        if blob is None:
            raise ArchiveCorrupt(f"session {session_id}'s log is archived; its archive is missing")
        found = decode(blob, tenant, session_id)
        if archived is not None and found.seq < int(archived):
            raise ArchiveCorrupt(
                f"archive of session {session_id} ends at {found.seq}, its log at {archived}"
            )
        if len(self._archives) >= _CACHED_ARCHIVES:
            self._archives.pop(next(iter(self._archives)))
        self._archives[cache_key] = found
        return found

    async def restore(self, tenant: str, session_id: str) -> None:
        """Bring an archived log back into Redis (nothing to do for one that is not).

        Parts of :data:`RESTORE_CHUNK` events, each skipping what is there already: safe
        to race and to retry after a crash. Readers see the archive until the last part."""
        keys = SessionKeys(tenant, session_id)
        archived, gen = await self.redis.hmget(keys.snapshot, "archived", "gen")
        if archived is None:
            return
        found = await self.archived(tenant, session_id)
        entries = entries_between(found, 0, int(archived))
        window = window_fields(event for _, _, event in entries)  # the archive left it out
        now = int(time.time() * 1000)
        parts = range(0, len(entries), RESTORE_CHUNK)
        for start in parts:
            chunk = entries[start : start + RESTORE_CHUNK]
            final = start + RESTORE_CHUNK >= len(entries)
            args: list[Any] = [gen or "0", now, keys.member, "1" if final else "0"]
            args += [len(window) if final else 0, *_flat(window.items() if final else ())]
            for seq, ts, event in chunk:
                args += [seq, ts, event]
            script_keys = [keys.log, keys.snapshot, keys.hot, keys.meta]
            done = await self.appender.script(self._restore, script_keys, args)
            if not done:
                return  # another restorer finished first

    async def trim_archived(self, tenant: str, session_id: str, seq: int, epoch: str) -> int:
        """Remove the log from Redis now that its archive copy (events ``1 … seq`` of
        ``epoch``) is confirmed written. Returns what ``lua/archive_trim.lua`` does:
        1 trimmed, 0 already archived, -1 the log moved on (nothing trimmed)."""
        keys = SessionKeys(tenant, session_id)
        try:
            outcome = await self.appender.script(
                self._trim,
                [keys.log, keys.snapshot, keys.hot, keys.meta],
                [seq, epoch, keys.member],
            )
        except ResponseError as exc:
            raise append_error(exc) from None
        return int(outcome)


def _flat(pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [item for pair in pairs for item in pair]
