"""The session log's append path: ``lua/append.lua`` (one event) and
``lua/append_batch.lua`` (several, in one round trip), the only writers of a log."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from ..ops import metrics, tracing
from .client import Store, commands, is_cluster
from .direct import DirectCalls, StoreCalls
from .durability import replicated
from .events import (
    EventType,
    JsonObject,
    Position,
    dumps,
    is_activity,
    is_index_neutral,
    snapshot_ops,
)
from .feed_bell import FeedBells
from .floors import SeqFloors, rewound
from .keys import partition_of, session_keys
from .log_errors import SessionArchived, StoreFull, append_error, is_oom

BOOKKEEPING_ROOM = 16
"""Events past ``max_events`` a full session still takes, but only the broker's own (a
notice, the end of the turn, a status, its deletion): a full session can be stopped,
told why and deleted. Agent updates and prompts stop at the bound."""


_BOUNDED = frozenset({EventType.UPDATE, EventType.PROMPT})


def lua_script(name: str) -> str:
    """The text of one of the log's Lua scripts (in ``lua/``)."""
    return resources.files(__package__).joinpath("lua", name).read_text()


def batch_script(append: str, batch: str) -> str:
    """The batch append script: ``append.lua``'s text made the function ``append_one``,
    then ``append_batch.lua``'s, which calls it for each event."""
    return "local function append_one(KEYS, ARGV)\n" + append + "\nend\n" + batch


class LogAppender:
    """Appends events to session logs (an archived one is restored first, by ``restore``)."""

    def __init__(
        self,
        redis: Store,
        *,
        direct: DirectCalls | None,
        restore: Callable[[str, str], Awaitable[None]],
        feed_maxlen: int,
        max_events: int,
    ) -> None:
        self.redis = redis
        self.calls = StoreCalls(redis, direct)
        """Where :meth:`append_many` goes: first on the own client's connection on a single server
        (opened on first use)."""
        self.restore = restore
        self.feed_maxlen = feed_maxlen
        self.max_events = max_events
        self._append = commands(redis).register_script(lua_script("append.lua"))
        self._append_batch = commands(redis).register_script(
            batch_script(lua_script("append.lua"), lua_script("append_batch.lua"))
        )
        self._floor = commands(redis).register_script(lua_script("floor.lua"))
        self._wait: tuple[int, float] | None = None
        self.floors = SeqFloors()
        """The highest seq of each session's log this process knows: each append passes it
        as its floor, so that a log that lost acknowledged events reuses none of their seqs
        (:mod:`.floors`)."""
        self.bells = FeedBells(redis) if is_cluster(redis) else None
        """On a cluster, the change feeds' bells, rung after appending (``feed_bell.py``)."""

    def wait_for_replicas(self, replicas: int, timeout: float) -> None:
        """Make each append wait until ``replicas`` replicas have it (see
        :mod:`.durability`); 0: no waiting. Appends then go through the client."""
        if replicas and not is_cluster(self.redis):
            self._wait = (replicas, timeout)
            self.calls = StoreCalls(self.redis, None)

    async def create(self, tenant: str, session_id: str, body: JsonObject) -> Position:
        """Start a new log with its ``created`` event, under a fresh random epoch."""
        if body.get("type") != EventType.CREATED:
            raise ValueError("a log starts with a 'created' event")
        return await self._run(
            session_id, *self._call(tenant, session_id, body, mode="create", epoch=_new_epoch())
        )

    async def append(
        self, tenant: str, session_id: str, body: JsonObject, *, fence: str = "", call: str = ""
    ) -> Position:
        """Append one event; raises :class:`SessionMissing`, :class:`Fenced`,
        :class:`SessionFull` (``max_events``) or :class:`StoreFull` (Redis at maxmemory).

        An archived session's log is restored first (:meth:`.ArchivedLogs.restore`; an
        unreadable archive raises :class:`~.archive.ArchiveCorrupt` and appends nothing),
        then appended to.

        ``call`` (default: a fresh one, see :func:`call_ids`) names this append: made
        again after a failure that left its outcome unknown, a call that was applied
        appends nothing more and returns the session's position, at or past the one it
        got. A session knows its last 16 calls.
        """
        call = call or _call_id()  # the same call after a restore
        for _ in range(3):
            floor = self.floors.asked(tenant, session_id)
            try:
                return await self._run(
                    session_id,
                    *self._call(
                        tenant, session_id, body, mode="append", fence=fence, call=call, floor=floor
                    ),
                )
            except SessionArchived:
                await self.restore(tenant, session_id)
        raise SessionArchived(f"session {session_id} was archived again while it was restored")

    async def append_many(
        self,
        items: Sequence[tuple[str, str, JsonObject, str]],
        calls: Sequence[str] | None = None,
        *,
        restore: bool = True,
    ) -> list[Position | Exception]:
        """Append several events (``(tenant, session id, body, fence)``, in this order) in one
        round trip and one script call (``lua/append_batch.lua``): each one is what
        :meth:`append` does, ``calls[i]`` naming the i-th. Returns each one's position, or
        the exception :meth:`append` would have raised for it. ``restore`` False: an event
        of an archived session is not appended (its outcome is :class:`SessionArchived`)
        rather than its log brought back for it.

        On a cluster one call may not span slots: it is one call per partition (every key of
        a session carries its partition's tag), the partitions' calls side by side. A
        session's events stay in order in its partition's call, and each partition's feed
        gets its events in order, which is all the order anyone can see."""
        ids = list(calls) if calls is not None else call_ids(len(items))
        results = await self._append_many(items, ids)
        for _ in range(3 if restore else 0):
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
        if self.bells is not None:  # the partitions' feeds, in one pipeline
            await self.bells.ring(session_keys(t, s).feed for t, s, _, _ in items)
        return [found[i] for i in range(len(items))]

    async def _append_batch_call(
        self, items: Sequence[tuple[str, str, JsonObject, str]], ids: Sequence[str]
    ) -> list[Position | Exception]:
        """One ``append_batch.lua`` call for ``items`` (all in one slot on a cluster)."""
        keys, args = self._batch_call(items, ids)
        with tracing.span("acp-broker append", events=len(items)):
            replies = await self._batch_script(keys, args)
        results: list[Position | Exception] = []
        floors = self.floors
        for (_, session_id, _, _), r in zip(items, replies, strict=True):
            if isinstance(r, ResponseError):
                results.append(append_error(r))
                continue
            seq = int(r[0])
            if len(r) > 2:
                rewound(session_id, int(r[2]), seq - 1, found_by="append")
            floors.reached(session_id, seq)
            results.append(Position(seq, str(r[1])))
        metrics.EVENTS_APPENDED.inc(sum(isinstance(r, Position) for r in results))
        return results

    def _batch_call(
        self, items: Sequence[tuple[str, str, JsonObject, str]], ids: Sequence[str]
    ) -> tuple[list[str], list[Any]]:
        """``append_batch.lua``'s keys and arguments: what is the same for the whole call
        (the time, the feed's length, the bounds) once, then 8 arguments an event and its
        snapshot operations (packing and parsing 22 an event was a third of the appender's
        CPU)."""
        keys: list[str] = []
        args: list[Any] = [
            len(items),
            int(time.time() * 1000),
            self.feed_maxlen,
            *self._bounds(),
        ]
        # As for a single append, the floor includes what a source saw (a front's presence
        # events are batched: after a failover, its hub alone knows the seqs it delivered).
        floor = self.floors.asked
        for (tenant, session_id, body, fence), call in zip(items, ids, strict=True):
            keys += _script_keys(tenant, session_id)
            ops = snapshot_ops(body)
            flags = (
                ("1" if is_activity(body) else "0")
                + ("1" if body.get("type") == EventType.DELETED else "0")
                + ("1" if is_index_neutral(body, ops) else "0")
                + ("1" if body.get("type") in _BOUNDED else "0")
            )
            args += (
                dumps(body),
                fence,
                tenant,
                session_id,
                call or _call_id(),
                flags,
                floor(tenant, session_id),
                len(ops),
            )
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
        floor: int = 0,
    ) -> tuple[list[str], list[Any]]:
        """The append script's keys and arguments for one event (``floor``: see
        :mod:`.floors`)."""
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
            floor,
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

    async def _run(self, session_id: str, keys: list[str], args: list[Any]) -> Position:
        """One call of the append script (keys and arguments from :meth:`_call`)."""
        try:
            with tracing.span("acp-broker append", events=1):
                reply = await self.script(self._append, keys, args)
        except ResponseError as exc:
            raise append_error(exc) from None
        metrics.EVENTS_APPENDED.inc()
        seq = int(reply[0])
        if len(reply) > 2:
            rewound(session_id, int(reply[2]), seq - 1, found_by="append")
        self.floors.reached(session_id, seq)
        if self.bells is not None:
            await self.bells.ring([keys[3]])
        return Position(seq, str(reply[1]))

    @property
    def direct_appends(self) -> DirectCalls | None:
        """The own client's calls :meth:`append_many` goes on first (None: there is none)."""
        return self.calls.direct

    async def _batch_script(self, keys: list[str], args: list[Any]) -> list[Any]:
        """One ``append_batch.lua`` call: its replies, an event's error as ``ResponseError``.

        On a single server it goes on the own client's connection (:meth:`.StoreCalls.script`):
        redis-py's layers (its packing walks the ~900 arguments of 64 events once more in
        Python, then the pool, the retry and the timeout) were about half of a batch
        append's CPU in the agent host's process. A lost connection sends the same call
        again on a fresh one, within the same deadline: every append in it carries its call
        id, so one the first try applied appends nothing the second time."""
        if self._wait is not None:
            return list(await self.script(self._append_batch, keys, args))
        try:
            return list(await self.calls.script(self._append_batch, keys, args))
        except ResponseError as exc:
            if is_oom(exc):
                raise StoreFull(str(exc)) from None
            raise

    async def leave_floor(self, tenant: str, session_id: str, seq: int, epoch: str) -> bool:
        """Leave ``seq`` (of log ``epoch``) in the session's snapshot as a floor every
        appender's next event goes past (``lua/floor.lua``): a watcher was handed it, and
        the log is now found behind it. False when the log is at or past it already."""
        keys = [session_keys(tenant, session_id).snapshot]
        return bool(await self.script(self._floor, keys, [seq, epoch]))

    async def script(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Call one of the log's scripts, through the client."""
        try:
            if self._wait is not None and script in (self._append, self._append_batch):
                replicas, timeout = self._wait
                return await replicated(
                    self.redis, script, keys, args, replicas=replicas, timeout=timeout
                )
            return await self.calls.run_script(script, keys, args)
        except ResponseError as exc:
            if is_oom(exc):
                raise StoreFull(str(exc)) from None
            raise


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


def call_ids(count: int) -> list[str]:
    """Fresh ids for ``count`` appends (keep them to make the same appends again): as
    :func:`_call_id` makes each, from one read of the system's randomness for all."""
    text = secrets.token_hex(6 * count)
    return [text[i : i + 12] for i in range(0, 12 * count, 12)]


def _call_id() -> str:
    return secrets.token_hex(6)  # 48 bits: two calls among a session's last 16 never collide


def _new_epoch() -> str:
    return secrets.token_hex(8)
