"""The command bus: how fronts hand commands to agent hosts, and hosts read them.

Two kinds of stream carry commands (see :mod:`broker.store.keys`): the shared queue
(``acpb:hosts:queue``: new sessions, sessions no host holds), which every host reads as one
consumer group, and each host's inbox (commands for the sessions it holds, answers to its
agents' requests), which only its host reads, in order, without a group. A command is one
entry whose field ``m`` is its encoded JSON. Replies go back on the asking front's
channel (:class:`~.live.Publisher`); the run-once marks of creating commands are
:class:`CommandMarks`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .boundary import port
from .client import Store, commands
from .errors import group_exists
from .groups import Entries
from .keys import INBOX_MAXLEN, command_taken_key, host_queue
from .streams import absent, id_key, trim_behind_group, trim_below


def just_past(entry_id: str) -> str:
    """The smallest stream id greater than ``entry_id``."""
    ms, seq = id_key(entry_id)
    return f"{ms}-{seq + 1}"


@port
class CommandBus:
    """The shared queue and the hosts' inboxes."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)

    async def send(self, stream: str, data: str) -> str:
        """Add the encoded command ``data`` to ``stream`` (the queue or an inbox, capped at
        about :data:`~.keys.INBOX_MAXLEN` entries); its entry id."""
        entry = await self.redis.xadd(stream, {"m": data}, maxlen=INBOX_MAXLEN, approximate=True)
        return str(entry)

    async def read_inbox(self, inbox: str, after: str, *, count: int, block_ms: int) -> Entries:
        """Up to ``count`` entries of ``inbox`` past ``after`` (``$``: only new ones), waiting
        up to ``block_ms`` for one."""
        replies = await self.redis.xread({inbox: after}, count=count, block=block_ms)
        return _entries(replies)

    async def create_queue_group(self, group: str, start: str) -> None:
        """Make the queue's consumer ``group`` (and the queue), reading from ``start`` (``$``:
        what comes next; ``0``: all of it); nothing when it exists already."""
        try:
            await self.redis.xgroup_create(host_queue(), group, id=start, mkstream=True)
        except Exception as exc:
            if not group_exists(exc):
                raise

    async def read_queue(self, group: str, consumer: str, *, count: int, block_ms: int) -> Entries:
        """Up to ``count`` new entries of the queue for ``consumer`` of ``group``, waiting up
        to ``block_ms``; raises the store's error for a group that is gone
        (:func:`~.errors.group_missing`)."""
        replies = await self.redis.xreadgroup(
            group, consumer, {host_queue(): ">"}, count=count, block=block_ms
        )
        return _entries(replies)

    async def ack_queued(self, group: str, entry_ids: Sequence[str]) -> None:
        """Acknowledge queue entries ``group`` delivered."""
        await self.redis.xack(host_queue(), group, *entry_ids)

    async def trim_inbox(self, inbox: str, read_up_to: str | None, ttl_ms: int) -> int:
        """Trim ``inbox`` up to and including ``read_up_to`` (None: nothing read yet), and set
        it to expire ``ttl_ms`` later; the entries removed."""
        removed = 0
        if read_up_to is not None:
            removed = await trim_below(self.redis, inbox, just_past(read_up_to))
        await self.redis.pexpire(inbox, ttl_ms)
        return removed

    async def ack_stale(self, group: str, horizon: float, *, count: int = 1000) -> int:
        """Acknowledge the queue's entries pending in ``group`` for over ``horizon`` seconds
        (up to ``count``); how many (0 when there is no queue or no group yet)."""
        stale = f"{int((time.time() - horizon) * 1000)}-0"
        try:
            pending = await self.redis.xpending_range(
                host_queue(), group, min="-", max=stale, count=count
            )
        except Exception as exc:
            if absent(exc):
                return 0
            raise
        ids = [str(entry["message_id"]) for entry in pending]
        if ids:
            await self.redis.xack(host_queue(), group, *ids)
        return len(ids)

    async def trim_queue(self, group: str) -> int:
        """Trim the queue behind ``group`` (:func:`~.streams.trim_behind_group`); the entries
        removed."""
        return await trim_behind_group(self.redis, host_queue(), group)


def _entries(replies: list[tuple[str, Entries]] | None) -> Entries:
    return [entry for _, entries in replies or [] for entry in entries]


@port
class CommandMarks:
    """The marks of the commands that create a session (:func:`~.keys.command_taken_key`),
    one per call id, with a time to live in ms."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)

    async def claim(self, rid: str, mark: str, ttl_ms: int) -> bool:
        """Set ``rid``'s mark to ``mark`` unless it has one; whether this call set it."""
        return bool(await self.redis.set(command_taken_key(rid), mark, nx=True, px=ttl_ms))

    async def get(self, rid: str) -> str | None:
        """``rid``'s mark (None: none, or lapsed)."""
        mark = await self.redis.get(command_taken_key(rid))
        return None if mark is None else str(mark)

    async def put(self, rid: str, mark: str, ttl_ms: int) -> None:
        """Set ``rid``'s mark, whatever it was."""
        await self.redis.set(command_taken_key(rid), mark, px=ttl_ms)

    async def extend(self, rid: str, ttl_ms: int) -> None:
        """Make ``rid``'s mark last ``ttl_ms`` from now."""
        await self.redis.pexpire(command_taken_key(rid), ttl_ms)

    async def clear(self, rid: str) -> None:
        """Delete ``rid``'s mark."""
        await self.redis.delete(command_taken_key(rid))
