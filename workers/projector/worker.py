"""The projector: keeps the session index in step with the logs.

It reads every partition's change feed through a consumer group, so several
projectors share the work and a restarted one resumes where the group left
off. Each notice names a session; the projector reads that session's snapshot
and projects it, which is idempotent, so a notice seen twice does no harm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

from broker.config import Settings
from broker.errors.failures import FailureLog
from broker.ops import metrics
from broker.store.client import Store
from broker.store.errors import group_missing
from broker.store.feeds import ChangeFeeds
from broker.store.groups import Entries, GroupReads
from broker.store.index import Notice, SessionIndex
from broker.store.log import SessionLog, SessionMissing

log = logging.getLogger(__name__)

GROUP = "projector"
RETRY_PAUSE = 1.0
"""Seconds between attempts while the store is out of reach."""


class Projector:
    """Consumes the change feeds and projects the sessions they name."""

    def __init__(
        self,
        redis: Store,
        *,
        batch: int = 500,
        block_ms: int = 1000,
        name: str | None = None,
        claim_idle_ms: int = 30_000,
        coalesce: float = 0.04,
    ) -> None:
        self.log = SessionLog(redis)
        self.index = SessionIndex(redis)
        self.batch = batch
        self.name = name or f"projector-{secrets.token_hex(4)}"
        self.changes = ChangeFeeds(redis, GROUP)
        self.feeds = self.changes.feeds
        self.claim_idle_ms = claim_idle_ms
        self.coalesce = coalesce
        self._last_read = 0.0
        self.reads = GroupReads(redis, GROUP, self.name, self.feeds, batch=batch, block_ms=block_ms)
        """The feeds' reads (with their acknowledgements)."""
        self.failures = FailureLog(log, "projection")

    async def ensure_groups(self) -> None:
        await self.changes.ensure_groups()

    async def run(self) -> None:
        """Project until cancelled: what this consumer left pending, then new notices, and
        now and then what a dead projector read but never acknowledged. Survives Redis
        going away, and coming back empty (the consumer groups are made again)."""
        try:
            await self._run()
        finally:
            await self.reads.aclose()
            self.index.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        pending, next_claim, groups_made = True, 0.0, False
        while True:
            if _cancelling():
                raise asyncio.CancelledError
            try:
                if not groups_made:
                    await self.ensure_groups()
                    groups_made = True
                if loop.time() >= next_claim:
                    await self.claim_abandoned()
                    next_claim = loop.time() + await self._claim_pause()
                await self._drain(pending=pending)
                pending = False
                self.failures.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if _cancelling():
                    raise asyncio.CancelledError from None
                if group_missing(exc):
                    # Redis came back empty: the feeds' consumer groups went with it.
                    log.warning("the change feeds' consumer groups are gone: making them again")
                    groups_made, pending = False, True
                else:
                    self.failures.failed(exc)
                await asyncio.sleep(RETRY_PAUSE)

    async def _drain(self, *, pending: bool) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Reads at most every ``coalesce`` seconds: notices that arrive meanwhile are
            # projected together, a session once for all of its events.
            await asyncio.sleep(max(0.0, self._last_read + self.coalesce - loop.time()))
            self._last_read = loop.time()
            entries = await self.reads.read(pending)
            if not entries:
                return
            await self._apply(entries)
            if not pending:
                return

    async def claim_abandoned(self) -> None:
        """Take over notices another consumer read long ago and never acknowledged."""
        claimed = await self.changes.claim(self.name, self.claim_idle_ms, self.batch)
        if claimed:
            log.info("claimed %d abandoned notices", sum(len(e) for _, e in claimed))
            await self._apply(claimed)

    async def _apply(self, replies: list[tuple[str, Entries]]) -> None:
        notices: dict[tuple[str, str], list[Notice]] = {}
        for _, entries in replies:
            for _, fields in entries:
                if fields and "t" in fields and "s" in fields:
                    notice = _notice(fields)
                    notices.setdefault((notice.tenant, notice.session_id), []).append(notice)
        # Sessions whose notices the index can take as they are (most agent updates) are
        # patched in place; the rest are projected from their snapshots.
        full = await self.index.touch_many(notices)
        metrics.PROJECTED.inc(len(notices) - len(full))
        await self._project_all(sorted(full))
        # Acknowledged with the next read (or by :meth:`_flush_acks`): a projector that dies
        # before then leaves them pending, and they are projected again (idempotent).
        for feed, entries in replies:
            self.reads.ack(feed, [entry_id for entry_id, _ in entries])

    async def _project_all(self, sessions: list[tuple[str, str]]) -> None:
        """Project a batch's sessions in a few round trips for all (a few round trips per
        session were most of a projector's CPU: 0.45 ms an event in issue 19's soak). A
        session that cannot be projected is skipped, logged: it must not hold up the feed
        behind it. A gone session has nothing to project."""
        snapshots = [s for s in await self.log.snapshots(sessions) if s is not None]
        failed = await self.index.project_many(snapshots)
        for snapshot, error in failed:
            log.error("could not project session %s; skipped: %r", snapshot.session_id, error)
        metrics.PROJECTED.inc(len(snapshots) - len(failed))

    async def project(self, tenant: str, session_id: str) -> None:
        with contextlib.suppress(SessionMissing):
            await self.index.project(await self.log.snapshot(tenant, session_id))
            metrics.PROJECTED.inc()

    async def _claim_pause(self) -> float:
        """Seconds until the next look for abandoned notices: half ``claim_idle_ms`` while
        notices come, all of it while the feeds are idle (a look is a command a feed, 256,
        the most an idle projector sends). The backlog is measured meanwhile, or known to be
        none: the last read found nothing new."""
        if self.reads.caught_up:
            metrics.PROJECTOR_BACKLOG.set(0)
            return self.claim_idle_ms / 1000
        await self.measure_backlog()
        return self.claim_idle_ms / 2000

    async def measure_backlog(self) -> int:
        """The notices no projector has read yet, over every feed (``XINFO GROUPS`` lag),
        published as :data:`~broker.ops.metrics.PROJECTOR_BACKLOG`."""
        backlog = await self.changes.backlog()
        metrics.PROJECTOR_BACKLOG.set(backlog)
        return backlog


def _notice(fields: dict[str, str]) -> Notice:
    """A change-feed notice (see ``lua/append.lua``); one without a readable seq (written by
    an older broker) is projected from its snapshot."""
    seq, updated = fields.get("q", ""), fields.get("u")
    if not seq.isdigit() or (updated and not updated.isdigit()):
        return Notice(fields["t"], fields["s"], 0, False)
    ms = int(updated) if updated else None
    return Notice(fields["t"], fields["s"], int(seq), updated is not None, ms)


def _cancelling() -> bool:
    """redis-py turns a cancellation during a blocking read into a TimeoutError."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def configured_projector(redis: Store, settings: Settings) -> Projector:
    """The projector a role or ``serve`` runs, with the settings' takeover time."""
    return Projector(redis, claim_idle_ms=round(settings.projector_claim_idle * 1000))


async def run_projector(redis: Store, **options: Any) -> None:
    """The projector role, as a coroutine a test or ``serve`` can start in-process."""
    await Projector(redis, **options).run()
