"""The session log's read paths: ranges of events (``XRANGE``, or the archive store for
an archived log) and snapshots, on this log's own connection where it has one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from .archive import ArchiveCorrupt, ArchivedLog, entries_between
from .archived import ArchivedLogs
from .boundary import store_error
from .client import Store, commands
from .direct import StoreCalls
from .errors import StoreError
from .events import EventRow, JsonObject, LogEvent, SessionSnapshot, events_of, window_fields
from .keys import SessionKeys
from .log_errors import SessionMissing
from .window import window_of


class LogReader:
    """Reads session logs and their snapshots."""

    def __init__(self, redis: Store, calls: StoreCalls, archives: ArchivedLogs) -> None:
        self.redis = commands(redis)
        self.calls = calls
        """The reads of :meth:`read` and :meth:`snapshot_and_holder`, replies as RESP gives
        them (a front's replays: redis-py's callbacks parsed a 10,000-event range in 28 ms,
        the raw reply took 9)."""
        self.archives = archives

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
        ranged = await self._range(keys, f"({after}-0", high, count)
        (got_epoch, archived, gen), rows, (archived_after, gen_after) = ranged
        if got_epoch is None:
            raise SessionMissing(session_id)
        if archived is None and archived_after is None and gen == gen_after:
            # No trim between the two snapshot reads (a trim sets ``archived`` and moves
            # ``gen``; a restore only ends while ``archived`` is set): the range is whole.
            return str(got_epoch), rows
        found = await self.archives.archived(tenant, session_id)
        if found.epoch != got_epoch:
            raise ArchiveCorrupt(
                f"archive of session {session_id} holds epoch {found.epoch}, not {got_epoch}"
            )
        last = found.seq if until is None else min(until, found.seq)
        picked = entries_between(found, after, last)
        if count is not None:
            picked = picked[:count]
        return found.epoch, picked

    async def _range(
        self, keys: SessionKeys, low: str, high: str, count: int | None
    ) -> tuple[list[Any], list[EventRow], list[Any]]:
        """The snapshot's epoch, archived mark and gen, the log's rows from ``low`` to
        ``high``, then the mark and gen again (none of the rows if the epoch is none)."""
        limit = ("COUNT", count) if count is not None else ()
        first, entries, last = await self.calls.calls(
            ("HMGET", keys.snapshot, "epoch", "archived", "gen"),
            ("XRANGE", keys.log, low, high, *limit),
            ("HMGET", keys.snapshot, "archived", "gen"),
        )
        rows = _stream_rows(entries) if first[0] is not None else []
        return first, rows, last

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

    async def head(self, tenant: str, session_id: str) -> tuple[int, str | None]:
        """The session's last seq and its log's epoch, as its snapshot says;
        :class:`SessionMissing` if there is no snapshot."""
        seq, epoch = await self.redis.hmget(
            SessionKeys(tenant, session_id).snapshot, ["seq", "epoch"]
        )
        if seq is None:
            raise SessionMissing(session_id)
        return int(seq), epoch

    async def heads(self, sessions: Sequence[tuple[str, str]]) -> list[int | None]:
        """The last seq of several sessions (``(tenant, session id)``) in one round trip;
        None for a session that has no snapshot."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for tenant, session_id in sessions:
                pipe.hget(SessionKeys(tenant, session_id).snapshot, "seq")
            replies = await pipe.execute()
        return [None if seq is None else int(seq) for seq in replies]

    async def snapshot_and_holder(
        self, tenant: str, session_id: str
    ) -> tuple[SessionSnapshot, str | None]:
        """The session's snapshot and the agent host that holds its lease (None: no host
        does), in one round trip; :class:`SessionMissing` if there is no snapshot.

        What a reconnecting client's ``session/resume`` reads before it answers: a node's
        clients reconnecting elsewhere at once make thousands a second, so on the own
        client's shared connection (:mod:`.direct`) all three commands go in one write with
        the other reads of the step, once for all of a step's resumes of one session."""
        keys = SessionKeys(tenant, session_id)
        try:  # translated here: the log hands this coroutine on as it is (no port's wrapper)
            flat_snap, flat_meta, holder = await self.calls.calls(
                ("HGETALL", keys.snapshot),
                ("HGETALL", keys.meta),
                ("GET", keys.lease),
                shared=True,  # the clients of a session resuming at once: one read
            )
        except StoreError:
            raise
        except RedisError as exc:
            raise store_error(exc) from exc
        snap, meta = _pairs(flat_snap), _pairs(flat_meta)
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

    async def window(self, tenant: str, session_id: str) -> JsonObject:
        """The session's window (``window.window_of``), folded from its archived log when
        it is archived (the archived snapshot leaves the window out)."""
        snapshot = await self.snapshot(tenant, session_id)
        if not snapshot.archived:
            return snapshot.window
        found = await self.archives.archived(tenant, session_id)
        return window_of(window_fields(event for _, _, event in found.entries))

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
        # From 1 to the snapshot's seq, but for those a rewound log skipped (store/floors.py).
        if (rows[-1][0] if rows else 0) != int(seq) or (rows and rows[0][0] != 1):
            raise ArchiveCorrupt(
                f"session {session_id}'s log in Redis ends at seq "
                f"{rows[-1][0] if rows else 0}, its snapshot at {seq}"
            )
        return ArchivedLog(tenant, session_id, epoch, int(seq), rows)


def _pairs(flat: list[str]) -> dict[str, str]:
    """A hash as HGETALL answers it in RESP2 (field, value, …), as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


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
