"""Session logs: the append path and the read paths.

A session's log is a Redis stream whose entry IDs are ``<seq>-0``; the append
script (``lua/append.lua``) is the only writer. Reads are plain ``XRANGE``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from .. import fastjson
from .client import Store, is_cluster
from .events import (
    EventType,
    JsonObject,
    LogEvent,
    Position,
    SessionSnapshot,
    dumps,
    is_activity,
    snapshot_ops,
)
from .keys import SessionKeys, partition_of


class SessionMissing(LookupError):
    """No session with this id in this tenant (or it belongs to another tenant)."""


class SessionExists(Exception):
    """A session with this id already exists."""


class Fenced(Exception):
    """The appender's fencing token is stale: another agent host holds the session."""


def _script(name: str) -> str:
    return resources.files(__package__).joinpath("lua", name).read_text()


class SessionLog:
    """Appends to and reads from session logs."""

    def __init__(self, redis: Store, *, feed_maxlen: int = 100_000) -> None:
        self.redis = redis
        self.feed_maxlen = feed_maxlen
        self._append = redis.register_script(_script("append.lua"))
        self._append_batch = redis.register_script(
            "local function append_one(KEYS, ARGV)\n"
            + _script("append.lua")
            + "\nend\n"
            + _script("append_batch.lua")
        )

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
        """Append one event; raises :class:`SessionMissing` or :class:`Fenced`.

        ``call`` (default: a fresh one, see :func:`call_ids`) names this append: made
        again after a failure that left its outcome unknown, a call that was applied
        appends nothing more and returns the session's position, at or past the one it
        got. A session knows its last 16 calls.
        """
        return await self._run(
            *self._call(tenant, session_id, body, mode="append", fence=fence, call=call)
        )

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
        keys: list[str] = []
        counts: list[int] = []
        args: list[Any] = []
        for (tenant, session_id, body, fence), call in zip(items, ids, strict=True):
            one_keys, one_args = self._call(
                tenant, session_id, body, mode="append", fence=fence, call=call
            )
            keys += one_keys
            counts.append(len(one_args))
            args += one_args
        replies = await self._script(self._append_batch, keys, [len(items), *counts, *args])
        return [
            _append_error(r) if isinstance(r, ResponseError) else Position(int(r[0]), str(r[1]))
            for r in replies
        ]

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
        keys = SessionKeys(tenant, session_id)
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
        ]
        for op in ops:
            args.extend(op)
        return [keys.log, keys.snapshot, keys.meta, keys.feed, keys.channel], args

    async def _run(self, keys: list[str], args: list[Any]) -> Position:
        """One call of the append script (keys and arguments from :meth:`_call`)."""
        try:
            seq, got_epoch = await self._script(self._append, keys, args)
        except ResponseError as exc:
            raise _append_error(exc) from None
        return Position(int(seq), str(got_epoch))

    async def _script(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Call one of the log's scripts."""
        try:
            return await script(keys=keys, args=args)
        except NoScriptError:
            # A node that just became a master may not know the script, and redis-py's
            # reload can go to the nodes it knew before the failover: EVAL goes by key.
            return await self.redis.eval(script.script, len(keys), *keys, *args)

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
        """Events with ``after < seq <= until`` in order (``epoch`` saves a snapshot read)."""
        keys = SessionKeys(tenant, session_id)
        if epoch is None:
            epoch = await self.redis.hget(keys.snapshot, "epoch")
            if epoch is None:
                raise SessionMissing(session_id)
        high = "+" if until is None else f"{until}-0"
        entries = await self.redis.xrange(keys.log, f"({after}-0", high, count=count)
        return [_entry_event(entry_id, fields, epoch) for entry_id, fields in entries]

    async def snapshot(self, tenant: str, session_id: str) -> SessionSnapshot:
        """The session's current snapshot; :class:`SessionMissing` if there is none."""
        keys = SessionKeys(tenant, session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.snapshot)
            pipe.hgetall(keys.meta)
            snap, meta = await pipe.execute()
        if not snap:
            raise SessionMissing(session_id)
        return SessionSnapshot.from_hashes(snap, meta)

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
            SessionSnapshot.from_hashes(snap, meta) if snap else None
            for snap, meta in zip(replies[::2], replies[1::2], strict=True)
        ]

    async def set_fence(self, tenant: str, session_id: str, fence: str) -> None:
        """Make ``fence`` the only token the append script accepts for this session."""
        await self.redis.hset(SessionKeys(tenant, session_id).snapshot, "fence", fence)


def call_ids(count: int) -> list[str]:
    """Fresh ids for ``count`` appends (keep them to make the same appends again)."""
    return [_call_id() for _ in range(count)]


def _call_id() -> str:
    return secrets.token_hex(6)  # 48 bits: two calls among a session's last 16 never collide


def _entry_event(entry_id: str, fields: dict[str, str], epoch: str) -> LogEvent:
    return LogEvent(
        seq=int(entry_id.split("-", 1)[0]),
        epoch=epoch,
        ts=int(fields["ts"]),
        body=fastjson.loads(fields["ev"]),
    )


def _append_error(exc: ResponseError) -> Exception:
    text = str(exc)
    if "NOSESSION" in text:
        return SessionMissing(text)
    if "EXISTS" in text:
        return SessionExists(text)
    if "FENCED" in text:
        return Fenced(text)
    return exc


def _new_epoch() -> str:
    return secrets.token_hex(8)


def new_session_id() -> str:
    """An unguessable broker session id (128 random bits)."""
    return "sess_" + secrets.token_hex(16)
