"""Session logs: the append path and the read paths.

A session's log is a Redis stream whose entry IDs are ``<seq>-0``; the append
script (``lua/append.lua``) is the only writer. Reads are plain ``XRANGE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

from hiredis import ReplyError
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, OutOfMemoryError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..ops import metrics, tracing
from .archive import ArchiveCorrupt, ArchivedLog, ArchiveStore, decode
from .client import Store, is_cluster
from .direct import DirectCalls, direct_calls
from .durability import replicated
from .events import (
    EventRow,
    EventType,
    JsonObject,
    LogEvent,
    Position,
    SessionSnapshot,
    dumps,
    events_of,
    is_activity,
    is_index_neutral,
    snapshot_ops,
    window_fields,
)
from .keys import SessionKeys, partition_of, session_keys
from .names import new_session_id as new_session_id  # where callers have long found it
from .window import window_of


class SessionMissing(LookupError):
    """No session with this id in this tenant (or it belongs to another tenant)."""


class SessionExists(Exception):
    """A session with this id already exists."""


class Fenced(Exception):
    """The appender's fencing token is stale: another agent host holds the session."""


class SessionArchived(Exception):
    """The session's log is in the archive store (the append script refuses until restored)."""


class SessionFull(Exception):
    """The session has as many events as ``max_events_per_session`` allows."""


class StoreFull(Exception):
    """Redis refused a write: it is at ``maxmemory`` (run it with ``noeviction``)."""


class ArchiveUnavailable(Exception):
    """The session's log is archived, and this process has no archive store to read it."""


BOOKKEEPING_ROOM = 16
"""Events past ``max_events`` a full session still takes, but only the broker's own (a
notice, the end of the turn, a status, its deletion): a full session can be stopped,
told why and deleted. Agent updates and prompts stop at the bound."""

_BOUNDED = frozenset({EventType.UPDATE, EventType.PROMPT})

RESTORE_CHUNK = 1000
"""Events per restore script call: a long log comes back in parts, each one short."""

_CACHED_ARCHIVES = 8


def _script(name: str) -> str:
    return resources.files(__package__).joinpath("lua", name).read_text()


def batch_script(append: str, batch: str) -> str:
    """The batch append script: ``append.lua``'s text made the function ``append_one``,
    then ``append_batch.lua``'s, which calls it for each event."""
    return "local function append_one(KEYS, ARGV)\n" + append + "\nend\n" + batch


class SessionLog:
    """Appends to and reads from session logs."""

    def __init__(
        self,
        redis: Store,
        *,
        feed_maxlen: int = 100_000,
        archive: ArchiveStore | None = None,
        max_events: int = 0,
        direct_reads: bool = False,
    ) -> None:
        self.redis = redis
        self._direct: DirectCalls | None = direct_calls(redis) if direct_reads else None
        """``direct_reads``: :meth:`read` on a connection of its own, past redis-py's
        layers (a front's replays: they parsed a 10,000-event range in 28 ms, raw in 9)."""
        self._direct_appends = self._direct or direct_calls(redis)
        """Where :meth:`append_many` goes first on a single server (opened on first use)."""
        self.feed_maxlen = feed_maxlen
        self.archive = archive
        self.max_events = max_events
        self._archives: dict[tuple[str, str, str], ArchivedLog] = {}
        self._restore = redis.register_script(_script("restore.lua"))
        self._trim = redis.register_script(_script("archive_trim.lua"))
        self._append = redis.register_script(_script("append.lua"))
        self._append_batch = redis.register_script(
            batch_script(_script("append.lua"), _script("append_batch.lua"))
        )
        self._wait: tuple[int, float] | None = None

    def wait_for_replicas(self, replicas: int, timeout: float) -> None:
        """Make each append wait until ``replicas`` replicas have it (see
        :mod:`.durability`); 0: no waiting. Appends then go through the client."""
        if replicas and not is_cluster(self.redis):
            self._wait = (replicas, timeout)
            self._direct_appends = None

    async def create(self, tenant: str, session_id: str, body: JsonObject) -> Position:
        """Start a new log with its ``created`` event, under a fresh random epoch."""
        if body.get("type") != EventType.CREATED:
            raise ValueError("a log starts with a 'created' event")
        return await self._run(
            *self._call(tenant, session_id, body, mode="create", epoch=_new_epoch())
        )

    async def append(
        self, tenant: str, session_id: str, body: JsonObject, *, fence: str = "", call: str = ""
    ) -> Position:
        """Append one event; raises :class:`SessionMissing`, :class:`Fenced`,
        :class:`SessionFull` (``max_events``) or :class:`StoreFull` (Redis at maxmemory).

        An archived session's log is restored first (:meth:`restore`; an unreadable archive
        raises :class:`~.archive.ArchiveCorrupt` and appends nothing), then appended to.

        ``call`` (default: a fresh one, see :func:`call_ids`) names this append: made
        again after a failure that left its outcome unknown, a call that was applied
        appends nothing more and returns the session's position, at or past the one it
        got. A session knows its last 16 calls.
        """
        call = call or _call_id()  # the same call after a restore
        for _ in range(3):
            try:
                return await self._run(
                    *self._call(tenant, session_id, body, mode="append", fence=fence, call=call)
                )
            except SessionArchived:
                await self.restore(tenant, session_id)
        raise SessionArchived(f"session {session_id} was archived again while it was restored")

    async def append_many(
        self,
        items: Sequence[tuple[str, str, JsonObject, str]],
        calls: Sequence[str] | None = None,
    ) -> list[Position | Exception]:
        """Append several events (``(tenant, session id, body, fence)``, in this order) in one
        round trip and one script call (``lua/append_batch.lua``): each one is what
        :meth:`append` does, ``calls[i]`` naming the i-th. Returns each one's position, or
        the exception :meth:`append` would have raised for it.

        On a cluster one call may not span slots: it is one call per partition (every key of
        a session carries its partition's tag), the partitions' calls side by side. A
        session's events stay in order in its partition's call, and each partition's feed
        gets its events in order, which is all the order anyone can see."""
        ids = list(calls) if calls is not None else call_ids(len(items))
        results = await self._append_many(items, ids)
        for _ in range(3):
            archived = [i for i, r in enumerate(results) if isinstance(r, SessionArchived)]
            if not archived:
                break
            for tenant, session_id in dict.fromkeys((items[i][0], items[i][1]) for i in archived):
                await self.restore(tenant, session_id)
            again = await self._append_many(
                [items[i] for i in archived], [ids[i] for i in archived]
            )
            for i, result in zip(archived, again, strict=True):
                results[i] = result
        return results

    async def _append_many(
        self, items: Sequence[tuple[str, str, JsonObject, str]], ids: Sequence[str]
    ) -> list[Position | Exception]:
        """:meth:`append_many` without the restore of archived sessions."""
        if not items:
            return []
        if not is_cluster(self.redis):
            return await self._append_batch_call(items, ids)
        by_partition: dict[int, list[int]] = {}
        for i, (_, session_id, _, _) in enumerate(items):
            by_partition.setdefault(partition_of(session_id), []).append(i)
        groups = list(by_partition.values())
        outcomes = await asyncio.gather(
            *(
                self._append_batch_call([items[i] for i in group], [ids[i] for i in group])
                for group in groups
            ),
            return_exceptions=True,  # every call ends before the batch fails; all retry as one
        )
        found: dict[int, Position | Exception] = {}
        for group, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            found.update(zip(group, outcome, strict=True))
        return [found[i] for i in range(len(items))]

    async def _append_batch_call(
        self, items: Sequence[tuple[str, str, JsonObject, str]], ids: Sequence[str]
    ) -> list[Position | Exception]:
        """One ``append_batch.lua`` call for ``items`` (all in one slot on a cluster)."""
        keys, args = self._batch_call(items, ids)
        with tracing.span("acp-broker append", events=len(items)):
            replies = await self._batch_script(keys, args)
        results: list[Position | Exception] = [
            _append_error(r) if isinstance(r, ResponseError) else Position(int(r[0]), str(r[1]))
            for r in replies
        ]
        metrics.EVENTS_APPENDED.inc(sum(isinstance(r, Position) for r in results))
        return results

    def _batch_call(
        self, items: Sequence[tuple[str, str, JsonObject, str]], ids: Sequence[str]
    ) -> tuple[list[str], list[Any]]:
        """``append_batch.lua``'s keys and arguments: what is the same for the whole call
        (the time, the feed's length, the bounds) once, then 7 arguments an event and its
        snapshot operations (packing and parsing 22 an event was a third of the appender's
        CPU)."""
        keys: list[str] = []
        args: list[Any] = [
            len(items),
            int(time.time() * 1000),
            self.feed_maxlen,
            *self._bounds(),
        ]
        for (tenant, session_id, body, fence), call in zip(items, ids, strict=True):
            keys += _script_keys(tenant, session_id)
            ops = snapshot_ops(body)
            flags = (
                ("1" if is_activity(body) else "0")
                + ("1" if body.get("type") == EventType.DELETED else "0")
                + ("1" if is_index_neutral(body, ops) else "0")
                + ("1" if body.get("type") in _BOUNDED else "0")
            )
            args += (dumps(body), fence, tenant, session_id, call or _call_id(), flags, len(ops))
            for op in ops:
                args += op
        return keys, args

    def _call(
        self,
        tenant: str,
        session_id: str,
        body: JsonObject,
        *,
        mode: str,
        epoch: str = "",
        fence: str = "",
        call: str = "",
    ) -> tuple[list[str], list[Any]]:
        """The append script's keys and arguments for one event."""
        ops = snapshot_ops(body)
        args: list[Any] = [
            int(time.time() * 1000),
            dumps(body),
            mode,
            epoch,
            fence,
            self.feed_maxlen,
            tenant,
            session_id,
            len(ops),
            "1" if is_activity(body) else "0",
            call or _call_id(),
            self._bound(body),
            "1" if body.get("type") == EventType.DELETED else "0",
            "1" if is_index_neutral(body, ops) else "0",
        ]
        for op in ops:
            args.extend(op)
        return _script_keys(tenant, session_id), args

    def _bound(self, body: JsonObject) -> int:
        """The most events the session may have once this one is in (0: no bound)."""
        bounded, other = self._bounds()
        return bounded if body.get("type") in _BOUNDED else other

    def _bounds(self) -> tuple[int, int]:
        """The most events a session may have once an update or prompt is in, and once any
        other event is (0: no bound)."""
        if not self.max_events:
            return 0, 0
        return self.max_events, self.max_events + BOOKKEEPING_ROOM

    async def _run(self, keys: list[str], args: list[Any]) -> Position:
        """One call of the append script (keys and arguments from :meth:`_call`)."""
        try:
            with tracing.span("acp-broker append", events=1):
                seq, got_epoch = await self._script(self._append, keys, args)
        except ResponseError as exc:
            raise _append_error(exc) from None
        metrics.EVENTS_APPENDED.inc()
        return Position(int(seq), str(got_epoch))

    async def _batch_script(self, keys: list[str], args: list[Any]) -> list[Any]:
        """One ``append_batch.lua`` call: its replies, an event's error as ``ResponseError``.

        On a single server it goes on a bare connection (:mod:`.direct`): redis-py's layers
        (its packing walks the ~900 arguments of 64 events once more in Python, then the
        pool, the retry and the timeout) were about half of a batch append's CPU in the
        agent host's process. Anything going wrong there (a cut or stalled connection, an
        error reply for the whole call: an unknown script, a full store) sends the same call
        again through the client, which knows how to recover: every append in it carries
        its call id, so one the first try applied appends nothing the second time.

        Both tries share one deadline, the bare connection's reply timeout: a stalled
        server fails the call once it passed, not after the client's timeout again. The
        bare connection's first open (connect, AUTH, SELECT) shares it too: a handshake
        answered late leaves the script only what is left."""
        direct = self._direct_appends
        if direct is None:
            return list(await self._script(self._append_batch, keys, args))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + direct.timeout
        sha = self._append_batch.sha
        try:
            replies = await direct.call("EVALSHA", sha, len(keys), *keys, *args, deadline=deadline)
        except RedisError:
            if loop.time() >= deadline:
                raise  # stalled a whole timeout: the caller tries again, with the call ids
        else:
            return [ResponseError(str(r)) if isinstance(r, ReplyError) else r for r in replies]
        try:
            async with asyncio.timeout_at(deadline):
                return list(await self._script(self._append_batch, keys, args))
        except TimeoutError:
            raise RedisTimeoutError(f"no reply within {direct.timeout:g} s") from None

    async def _script(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Call one of the log's scripts."""
        try:
            if self._wait is not None and script in (self._append, self._append_batch):
                replicas, timeout = self._wait
                return await replicated(
                    self.redis, script, keys, args, replicas=replicas, timeout=timeout
                )
            try:
                return await script(keys=keys, args=args)
            except NoScriptError:
                # A node that just became a master may not know the script, and redis-py's
                # reload can go to the nodes it knew before the failover: EVAL goes by key.
                return await self.redis.eval(script.script, len(keys), *keys, *args)
        except ResponseError as exc:
            if is_oom(exc):
                raise StoreFull(str(exc)) from None
            raise

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
        """Events with ``after < seq <= until`` in order, from Redis or, for an archived
        session, from the archive store (the same events, positions and epoch).

        ``epoch`` is accepted for callers that know it; the snapshot is read anyway, in the
        same round trip, because it tells whether the log is archived. Raises
        :class:`SessionMissing`, :class:`ArchiveCorrupt` or :class:`ArchiveUnavailable`."""
        got_epoch, rows = await self.read_rows(
            tenant, session_id, after=after, until=until, count=count
        )
        return events_of(rows, got_epoch)

    async def read_rows(
        self,
        tenant: str,
        session_id: str,
        *,
        after: int = 0,
        until: int | None = None,
        count: int | None = None,
    ) -> tuple[str, list[EventRow]]:
        """:meth:`read` with the events as stored, unparsed, and the log's epoch: for a
        caller that may send most of them on as they are (a replay)."""
        keys = SessionKeys(tenant, session_id)
        high = "+" if until is None else f"{until}-0"
        ranged = await self._range_direct(keys, f"({after}-0", high, count)
        if ranged is None:
            ranged = await self._range(keys, f"({after}-0", high, count)
        (got_epoch, archived, gen), rows, (archived_after, gen_after) = ranged
        if got_epoch is None:
            raise SessionMissing(session_id)
        if archived is None and archived_after is None and gen == gen_after:
            # No trim between the two snapshot reads (a trim sets ``archived`` and moves
            # ``gen``; a restore only ends while ``archived`` is set): the range is whole.
            return str(got_epoch), rows
        found = await self._archived(tenant, session_id)
        if found.epoch != got_epoch:
            raise ArchiveCorrupt(
                f"archive of session {session_id} holds epoch {found.epoch}, not {got_epoch}"
            )
        last = found.seq if until is None else min(until, found.seq)
        picked = list(found.entries[after:last])
        if count is not None:
            picked = picked[:count]
        return found.epoch, picked

    async def _range(
        self, keys: SessionKeys, low: str, high: str, count: int | None
    ) -> tuple[list[Any], list[EventRow], list[Any]]:
        """The snapshot's epoch, archived mark and gen, the log's rows from ``low`` to
        ``high``, then the mark and gen again (none of the rows if the epoch is none)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.snapshot, "epoch", "archived", "gen")
            pipe.xrange(keys.log, low, high, count=count)
            pipe.hmget(keys.snapshot, "archived", "gen")
            first, entries, last = await pipe.execute()
        rows = _client_rows(entries) if first[0] is not None else []
        return first, rows, last

    async def _range_direct(
        self, keys: SessionKeys, low: str, high: str, count: int | None
    ) -> tuple[list[Any], list[EventRow], list[Any]] | None:
        """:meth:`_range` on this log's own connection; None without one, or on any error
        (the client's way, which recovers from anything, then reads it)."""
        if self._direct is None:
            return None
        limit = ("COUNT", count) if count is not None else ()
        with contextlib.suppress(RedisError):
            first, entries, last = await self._direct.calls(
                ("HMGET", keys.snapshot, "epoch", "archived", "gen"),
                ("XRANGE", keys.log, low, high, *limit),
                ("HMGET", keys.snapshot, "archived", "gen"),
            )
            rows = _stream_rows(entries) if first[0] is not None else []
            return first, rows, last
        return None

    def close(self) -> None:
        """Close the connection :meth:`read` reads on, if one was opened (the next read
        opens it again)."""
        if self._direct is not None:
            self._direct.close()
        if self._direct_appends is not None and self._direct_appends is not self._direct:
            self._direct_appends.close()

    async def _archived(self, tenant: str, session_id: str) -> ArchivedLog:
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
        found = await self._archived(tenant, session_id)
        entries = found.entries[: int(archived)]
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
            done = await self._script(self._restore, script_keys, args)
            if not done:
                return  # another restorer finished first

    async def window(self, tenant: str, session_id: str) -> JsonObject:
        """The session's window (``window.window_of``), folded from its archived log when
        it is archived (the archived snapshot leaves the window out)."""
        snapshot = await self.snapshot(tenant, session_id)
        if not snapshot.archived:
            return snapshot.window
        found = await self._archived(tenant, session_id)
        return window_of(window_fields(event for _, _, event in found.entries))

    async def trim_archived(self, tenant: str, session_id: str, seq: int, epoch: str) -> int:
        """Remove the log from Redis now that its archive copy (events ``1 … seq`` of
        ``epoch``) is confirmed written. Returns what ``lua/archive_trim.lua`` does:
        1 trimmed, 0 already archived, -1 the log moved on (nothing trimmed)."""
        keys = SessionKeys(tenant, session_id)
        try:
            outcome = await self._script(
                self._trim,
                [keys.log, keys.snapshot, keys.hot, keys.meta],
                [seq, epoch, keys.member],
            )
        except ResponseError as exc:
            raise _append_error(exc) from None
        return int(outcome)

    async def read_whole(self, tenant: str, session_id: str) -> ArchivedLog | None:
        """The whole log as it is in Redis now, with its epoch (to archive it), or None when
        it is archived already. One round trip: the snapshot, the range, the snapshot again;
        an append in between (the seq moved) is read again."""
        keys = SessionKeys(tenant, session_id)
        while True:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hmget(keys.snapshot, "seq", "epoch", "archived")
                pipe.xrange(keys.log, "-", "+")
                pipe.hmget(keys.snapshot, "seq", "archived")
                (seq, epoch, archived), entries, after = await pipe.execute()
            if epoch is None:
                raise SessionMissing(session_id)
            if archived is not None or after[1] is not None:
                return None
            if after[0] == seq:
                break
        rows = _client_rows(entries)
        if len(rows) != int(seq) or any(row[0] != n for n, row in enumerate(rows, 1)):
            raise ArchiveCorrupt(
                f"session {session_id}'s log in Redis holds {len(rows)} of {seq} events"
            )
        return ArchivedLog(tenant, session_id, epoch, int(seq), rows)

    async def snapshot(self, tenant: str, session_id: str) -> SessionSnapshot:
        """The session's current snapshot; :class:`SessionMissing` if there is none."""
        keys = SessionKeys(tenant, session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.snapshot)
            pipe.hgetall(keys.meta)
            snap, meta = await pipe.execute()
        if not snap:
            raise SessionMissing(session_id)
        return SessionSnapshot.from_hashes(snap, meta, tenant=tenant, session_id=session_id)

    async def snapshot_and_holder(
        self, tenant: str, session_id: str
    ) -> tuple[SessionSnapshot, str | None]:
        """The session's snapshot and the agent host that holds its lease (None: no host
        does), in one round trip; :class:`SessionMissing` if there is no snapshot.

        What a reconnecting client's ``session/resume`` reads before it answers: a node's
        clients reconnecting elsewhere at once make thousands a second, so with
        ``direct_reads`` they are read on this log's own connection (:mod:`.direct`), all
        three commands in one write with the other reads of the step, once for all of a
        step's resumes of one session; on any error, and elsewhere, through the client."""
        keys = SessionKeys(tenant, session_id)
        replies: list[Any] | None = None
        if self._direct is not None:
            with contextlib.suppress(RedisError):  # the client's way recovers from anything
                snap, meta, holder = await self._direct.calls(
                    ("HGETALL", keys.snapshot),
                    ("HGETALL", keys.meta),
                    ("GET", keys.lease),
                    shared=True,  # the clients of a session resuming at once: one read
                )
                replies = [_pairs(snap), _pairs(meta), holder]
        if replies is None:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(keys.snapshot)
                pipe.hgetall(keys.meta)
                pipe.get(keys.lease)
                replies = await pipe.execute()
        snap, meta, holder = replies
        if not snap:
            raise SessionMissing(session_id)
        snapshot = SessionSnapshot.from_hashes(snap, meta, tenant=tenant, session_id=session_id)
        return snapshot, holder or None

    async def snapshots(self, sessions: Sequence[tuple[str, str]]) -> list[SessionSnapshot | None]:
        """The snapshots of several sessions (``(tenant, session id)``) in one round trip;
        None for a session that has none."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for tenant, session_id in sessions:
                keys = SessionKeys(tenant, session_id)
                pipe.hgetall(keys.snapshot)
                pipe.hgetall(keys.meta)
            replies = await pipe.execute()
        return [
            SessionSnapshot.from_hashes(snap, meta, tenant=tenant, session_id=session_id)
            if snap
            else None
            for (tenant, session_id), snap, meta in zip(
                sessions, replies[::2], replies[1::2], strict=True
            )
        ]

    async def set_fence(self, tenant: str, session_id: str, fence: str) -> None:
        """Make ``fence`` the only token the append script accepts for this session."""
        await self.redis.hset(SessionKeys(tenant, session_id).snapshot, "fence", fence)


def _script_keys(tenant: str, session_id: str) -> list[str]:
    """The append script's 7 keys for one session's event, in its order."""
    keys = session_keys(tenant, session_id)
    return [
        keys.log,
        keys.snapshot,
        keys.meta,
        keys.feed,
        keys.channel,
        keys.hot,
        keys.deleted,
    ]


def _flat(pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [item for pair in pairs for item in pair]


def _pairs(flat: list[str]) -> dict[str, str]:
    """A hash as HGETALL answers it on a bare connection (field, value, …), as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def call_ids(count: int) -> list[str]:
    """Fresh ids for ``count`` appends (keep them to make the same appends again): as
    :func:`_call_id` makes each, from one read of the system's randomness for all."""
    text = secrets.token_hex(6 * count)
    return [text[i : i + 12] for i in range(0, 12 * count, 12)]


def _call_id() -> str:
    return secrets.token_hex(6)  # 48 bits: two calls among a session's last 16 never collide


def _client_rows(entries: list[tuple[str, dict[str, str]]]) -> list[EventRow]:
    """The rows of an ``XRANGE`` reply as redis-py gives it (each entry an id and its
    fields, ``ts`` and ``ev`` as ``append.lua`` writes them, as a dict)."""
    return [(int(i.partition("-")[0]), int(f["ts"]), f["ev"]) for i, f in entries]


def _stream_rows(entries: list[list[Any]]) -> list[EventRow]:
    """The rows of a raw ``XRANGE`` reply (each entry an id and its fields as a flat list:
    ``ts``, ``ev`` as ``append.lua`` writes them, or in any order)."""
    rows = []
    for entry_id, fields in entries:
        if len(fields) == 4 and fields[0] == "ts" and fields[2] == "ev":
            ts, ev = fields[1], fields[3]
        else:
            named = dict(zip(fields[::2], fields[1::2], strict=True))
            ts, ev = named["ts"], named["ev"]
        rows.append((int(entry_id.partition("-")[0]), int(ts), ev))
    return rows


def is_oom(exc: BaseException) -> bool:
    """Whether Redis refused a command because it is at ``maxmemory``."""
    # redis-py raises OutOfMemoryError for a plain command; a script's error keeps the text.
    return isinstance(exc, OutOfMemoryError) or (
        isinstance(exc, ResponseError) and "OOM" in str(exc) and "maxmemory" in str(exc)
    )


def _append_error(exc: ResponseError) -> Exception:
    text = str(exc)
    if is_oom(exc):
        return StoreFull(text)
    if "ARCHIVED" in text:
        return SessionArchived(text)
    if "LIMIT" in text:
        return SessionFull(text)
    if "NOSESSION" in text:
        return SessionMissing(text)
    if "EXISTS" in text:
        return SessionExists(text)
    if "FENCED" in text:
        return Fenced(text)
    return exc


def _new_epoch() -> str:
    return secrets.token_hex(8)
