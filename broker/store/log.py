"""Session logs: the append path and the read paths.

A session's log is a Redis stream whose entry IDs are ``<seq>-0``; the append
script (``lua/append.lua``) is the only writer (:mod:`.appends`). Reads are plain
``XRANGE`` (:mod:`.reads`); an archived log is read from the archive store, and
restored into Redis before an append (:mod:`.archived`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from .appends import BOOKKEEPING_ROOM as BOOKKEEPING_ROOM
from .appends import LogAppender
from .appends import batch_script as batch_script
from .appends import call_ids as call_ids
from .archive import ArchivedLog, ArchiveStore
from .archived import RESTORE_CHUNK as RESTORE_CHUNK
from .archived import ArchivedLogs
from .boundary import port
from .client import Store, commands
from .direct import store_calls
from .events import EventRow, JsonObject, LogEvent, Position, SessionSnapshot
from .floors import FloorSource
from .keys import SessionKeys
from .log_errors import ArchiveUnavailable as ArchiveUnavailable
from .log_errors import Fenced as Fenced
from .log_errors import SessionArchived as SessionArchived
from .log_errors import SessionExists as SessionExists
from .log_errors import SessionFull as SessionFull
from .log_errors import SessionMissing as SessionMissing
from .log_errors import StoreFull as StoreFull
from .log_errors import is_oom as is_oom
from .names import new_session_id as new_session_id  # where callers have long found it
from .reads import LogReader


@port
class SessionLog:
    """Appends to and reads from session logs: the one object its callers hold, made of
    an :class:`.LogAppender`, a :class:`.LogReader` and the :class:`.ArchivedLogs`."""

    def __init__(
        self,
        redis: Store,
        *,
        feed_maxlen: int = 100_000,
        archive: ArchiveStore | None = None,
        max_events: int = 0,
    ) -> None:
        self.redis = commands(redis)
        reads = store_calls(redis)
        self.appender = LogAppender(
            redis,
            direct=reads.direct,
            restore=self.restore,
            feed_maxlen=feed_maxlen,
            max_events=max_events,
        )
        self.archives = ArchivedLogs(redis, archive, self.appender)
        self.reader = LogReader(redis, reads, self.archives)

    def wait_for_replicas(self, replicas: int, timeout: float) -> None:
        """See :meth:`.LogAppender.wait_for_replicas`."""
        self.appender.wait_for_replicas(replicas, timeout)

    def add_floor_source(self, source: FloorSource) -> None:
        """See :meth:`.SeqFloors.add_source`."""
        self.appender.floors.add_source(source)

    async def leave_floor(self, tenant: str, session_id: str, seq: int, epoch: str) -> bool:
        """See :meth:`.LogAppender.leave_floor`."""
        return await self.appender.leave_floor(tenant, session_id, seq, epoch)

    async def create(self, tenant: str, session_id: str, body: JsonObject) -> Position:
        """See :meth:`.LogAppender.create`."""
        return await self.appender.create(tenant, session_id, body)

    async def append(
        self, tenant: str, session_id: str, body: JsonObject, *, fence: str = "", call: str = ""
    ) -> Position:
        """See :meth:`.LogAppender.append`."""
        return await self.appender.append(tenant, session_id, body, fence=fence, call=call)

    async def append_many(
        self,
        items: Sequence[tuple[str, str, JsonObject, str]],
        calls: Sequence[str] | None = None,
        *,
        restore: bool = True,
    ) -> list[Position | Exception]:
        """See :meth:`.LogAppender.append_many`."""
        return await self.appender.append_many(items, calls, restore=restore)

    async def read(
        self,
        tenant: str,
        session_id: str,
        *,
        after: int = 0,
        until: int | None = None,
        count: int | None = None,
        epoch: str | None = None,
    ) -> list[LogEvent]:
        """See :meth:`.LogReader.read`."""
        return await self.reader.read(
            tenant, session_id, after=after, until=until, count=count, epoch=epoch
        )

    async def read_rows(
        self,
        tenant: str,
        session_id: str,
        *,
        after: int = 0,
        until: int | None = None,
        count: int | None = None,
    ) -> tuple[str, list[EventRow]]:
        """See :meth:`.LogReader.read_rows`."""
        return await self.reader.read_rows(
            tenant, session_id, after=after, until=until, count=count
        )

    async def snapshot(self, tenant: str, session_id: str) -> SessionSnapshot:
        """See :meth:`.LogReader.snapshot`."""
        return await self.reader.snapshot(tenant, session_id)

    async def head(self, tenant: str, session_id: str) -> tuple[int, str | None]:
        """See :meth:`.LogReader.head`."""
        return await self.reader.head(tenant, session_id)

    async def heads(self, sessions: Sequence[tuple[str, str]]) -> list[int | None]:
        """See :meth:`.LogReader.heads`."""
        return await self.reader.heads(sessions)

    def snapshot_and_holder(
        self, tenant: str, session_id: str
    ) -> Awaitable[tuple[SessionSnapshot, str | None]]:
        """See :meth:`.LogReader.snapshot_and_holder` (its coroutine, not one around it:
        what each connect's ``session/resume`` reads)."""
        return self.reader.snapshot_and_holder(tenant, session_id)

    async def snapshots(self, sessions: Sequence[tuple[str, str]]) -> list[SessionSnapshot | None]:
        """See :meth:`.LogReader.snapshots`."""
        return await self.reader.snapshots(sessions)

    async def window(self, tenant: str, session_id: str) -> JsonObject:
        """See :meth:`.LogReader.window`."""
        return await self.reader.window(tenant, session_id)

    async def read_whole(self, tenant: str, session_id: str) -> ArchivedLog | None:
        """See :meth:`.LogReader.read_whole`."""
        return await self.reader.read_whole(tenant, session_id)

    async def restore(self, tenant: str, session_id: str) -> None:
        """See :meth:`.ArchivedLogs.restore`."""
        await self.archives.restore(tenant, session_id)

    async def trim_archived(self, tenant: str, session_id: str, seq: int, epoch: str) -> int:
        """See :meth:`.ArchivedLogs.trim_archived`."""
        return await self.archives.trim_archived(tenant, session_id, seq, epoch)

    async def set_fence(self, tenant: str, session_id: str, fence: str) -> None:
        """Make ``fence`` the only token the append script accepts for this session."""
        await self.redis.hset(SessionKeys(tenant, session_id).snapshot, "fence", fence)

    def close(self) -> None:
        """Close the connection :meth:`read` reads on, if one was opened (the next read
        opens it again)."""
        self.reader.calls.close()
        appends = self.appender.direct_appends
        if appends is not None and appends is not self.reader.calls.direct:
            appends.close()
