"""The archiving role: idle sessions' logs out to the archive store, deleted sessions purged.

Archiving one session, step by step (each step named for :data:`STOP_AT_ENV`):

1. ``read``: the whole log and its epoch, from Redis (checked contiguous, ``1 … seq``);
2. ``write``: its blob put in the archive store (durable when ``put`` returns);
3. ``confirm``: the blob read back and decoded whole, the same seq and epoch;
4. ``trim``: one script (``lua/archive_trim.lua``) marks the snapshot ``archived`` and
   deletes the log, only if the session's seq and epoch are still the ones archived.

A crash before 4 leaves the log in Redis, whole, and a copy that the next round replaces;
a crash after it leaves the archive, confirmed. No step writes a second copy of an event
into Redis, so nothing is lost and nothing is doubled. An append racing the archive moves
the seq: the trim refuses, and a later round archives the longer log.

Purging one deleted session (past ``deleted_retention``): its archive, its Redis keys,
its index rows, then its entry in the partition's deleted set, each step idempotent, so
a crash anywhere is finished by the next round. Any number of these roles may run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.config import Settings
from broker.errors.failures import FailureLog
from broker.ops import metrics
from broker.store.archive import ArchiveCorrupt, ArchiveStore, decode, encode
from broker.store.census import CENSUS_INTERVAL, census
from broker.store.client import Store
from broker.store.index import SessionIndex
from broker.store.keys import PARTITIONS
from broker.store.log import SessionLog, SessionMissing
from broker.store.retention import RetentionSets

log = logging.getLogger(__name__)

STOP_AT_ENV = "ACP_BROKER_TEST_ARCHIVE_KILL_AT"
"""Tests only: the step (``read``, ``write``, ``confirm``, ``trim``) before which the
process kills itself with SIGKILL, to prove a crash there loses and doubles nothing."""


@dataclass(slots=True)
class RoundOutcome:
    """What one archive or purge round did (or, in a dry run, would do)."""

    sessions: int = 0
    events: int = 0
    bytes: int = 0
    skipped: int = 0


Progress = Callable[[RoundOutcome], None]


def _step(name: str) -> None:
    if os.environ.get(STOP_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class Archiver:
    """Archives idle sessions and purges deleted ones (see the module's description)."""

    def __init__(
        self,
        redis: Store,
        archive: ArchiveStore,
        *,
        session_log: SessionLog | None = None,
    ) -> None:
        self.store = redis
        self.sets = RetentionSets(redis)
        self.archive = archive
        self.log = session_log or SessionLog(redis, archive=archive)
        self.index = SessionIndex(redis)

    async def idle(self, partition: int, older_than: float) -> list[tuple[str, str]]:
        """Sessions of ``partition`` whose log is in Redis and got no append for
        ``older_than`` seconds."""
        return await self.sets.idle(partition, older_than)

    async def deleted(self, partition: int, older_than: float) -> list[tuple[str, str]]:
        """Sessions of ``partition`` deleted over ``older_than`` seconds ago, not purged yet."""
        return await self.sets.deleted(partition, older_than)

    async def archive_session(self, tenant: str, session_id: str) -> int:
        """Archive one session's log; returns how many events left Redis (0: none did,
        because it is archived already, is gone, or moved on while archived)."""
        _step("read")
        try:
            whole = await self.log.read_whole(tenant, session_id)
        except SessionMissing:
            await self.sets.cooled(tenant, session_id)  # purged: nothing left to archive
            return 0
        if whole is None:
            await self.sets.cooled(tenant, session_id)
            return 0
        blob = encode(whole)
        _step("write")
        await self.archive.put(tenant, session_id, blob)
        _step("confirm")
        back = await self.archive.get(tenant, session_id)
        if back is None:
            raise ArchiveCorrupt(f"archive of session {session_id} vanished after its write")
        copy = decode(back, tenant, session_id)
        if (copy.seq, copy.epoch) != (whole.seq, whole.epoch):
            raise ArchiveCorrupt(f"archive of session {session_id} reads back differently")
        _step("trim")
        if await self.log.trim_archived(tenant, session_id, whole.seq, whole.epoch) != 1:
            return 0
        return whole.seq

    async def purge_session(self, tenant: str, session_id: str) -> bool:
        """Purge one deleted session everywhere; False if it is not (or no longer) deleted."""
        status = await self.sets.snapshot_field(tenant, session_id, "status")
        if status is not None and status != "DELETED":
            await self.sets.purged(tenant, session_id)
            return False
        await self.archive.delete(tenant, session_id)
        await self.sets.drop(tenant, session_id)
        await self.index.remove(tenant, session_id)
        await self.sets.purged(tenant, session_id)
        return True

    async def archive_round(
        self, older_than: float, *, dry_run: bool = False, progress: Progress | None = None
    ) -> RoundOutcome:
        """Archive every session idle for ``older_than`` seconds (``dry_run``: count them)."""
        outcome = RoundOutcome()
        for tenant, session_id in await self._each(self.idle, older_than):
            if dry_run:
                seq = await self.sets.snapshot_field(tenant, session_id, "seq")
                moved = int(seq or 0)
            else:
                moved = await self.archive_session(tenant, session_id)
            if moved:
                outcome.sessions += 1
                outcome.events += moved
            else:
                outcome.skipped += 1
            if progress is not None:
                progress(outcome)
        return outcome

    async def _each(
        self, find: Callable[[int, float], Awaitable[list[tuple[str, str]]]], older_than: float
    ) -> list[tuple[str, str]]:
        """What ``find`` finds in every partition, partition by partition."""
        found: list[tuple[str, str]] = []
        for partition in range(PARTITIONS):
            found += await find(partition, older_than)
        return found

    async def purge_round(
        self, older_than: float, *, dry_run: bool = False, progress: Progress | None = None
    ) -> RoundOutcome:
        """Purge every session deleted more than ``older_than`` seconds ago."""
        outcome = RoundOutcome()
        for tenant, session_id in await self._each(self.deleted, older_than):
            if dry_run or await self.purge_session(tenant, session_id):
                outcome.sessions += 1
            else:
                outcome.skipped += 1
            if progress is not None:
                progress(outcome)
        return outcome


async def run_archiving(
    archiver: Archiver, *, archive_after: float | None, deleted_retention: float, interval: float
) -> None:
    """The role's loop: a purge round and (unless ``archive_after`` is None) an archive
    round every ``interval`` seconds, until cancelled. A failed round is logged in one line
    (summarised while failures go on, as :class:`~broker.errors.failures.FailureLog` does) and the
    next one retries it (every step is idempotent)."""
    failures = FailureLog(log, "archiving")
    counted = -CENSUS_INTERVAL  # the sessions are counted at the first round
    while True:
        await asyncio.sleep(interval)
        try:
            if time.monotonic() - counted >= CENSUS_INTERVAL:
                counted = time.monotonic()
                await count_sessions(archiver.store)
            purged = await archiver.purge_round(deleted_retention)
            if purged.sessions:
                log.info("purged %d deleted sessions", purged.sessions)
            if archive_after is not None:
                done = await archiver.archive_round(archive_after)
                if done.sessions:
                    log.info("archived %d sessions (%d events)", done.sessions, done.events)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # StoreFull too: archiving pauses until Redis has room
            if _cancelling():
                raise asyncio.CancelledError from None
            failures.failed(exc)
        else:
            failures.succeeded()


async def count_sessions(redis: Store) -> None:
    """The hot and archived sessions, counted into their metrics."""
    counts = await census(redis)
    metrics.SESSIONS_HOT.set(counts.hot)
    metrics.SESSIONS_ARCHIVED.set(counts.archived)


def _cancelling() -> bool:
    """redis-py can turn a cancellation during a read into another error."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def archiving_role(redis: Store, archive: ArchiveStore, settings: Settings) -> None:
    """The archiving role as ``serve`` and the projector role run it, from ``settings``."""
    session_log = SessionLog(redis, archive=archive, feed_maxlen=settings.feed_maxlen)
    await run_archiving(
        Archiver(redis, archive, session_log=session_log),
        archive_after=settings.archive_after,
        deleted_retention=settings.deleted_retention,
        interval=settings.archive_interval,
    )
