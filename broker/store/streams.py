"""Trimming a Redis stream behind its consumer group: what every reader is done with goes.

Used for the partitions' change feeds (read by the projectors' group) and the agent hosts'
shared command queue (read by the hosts' group). An entry is needed until the group has
delivered it and its reader has acknowledged it, so a stream is trimmed up to, and
including, the group's last delivered entry, but never past the oldest pending one.

Why that bound is safe with appends and reads racing the trim: a group delivers a stream's
entries in id order, so every entry up to its last delivered id (read first) was delivered
before the read, and any such entry not pending when ``XPENDING`` answers (read second)
has been acknowledged. A stream whose group is missing is never trimmed: a reader that
makes the group reads the stream from its start.

**The bound.** The trim is approximate (``XTRIM MINID ~``): Redis drops whole nodes of the
stream (up to ``stream-node-max-entries``, 100, entries and ``stream-node-max-bytes``, 4 KB,
each), cheaply, and never an entry at or past the floor. Since the floor lies just past the
last delivered entry, a stream whose entries are all consumed is emptied entirely (its last
node is freed with the rest); while a reader is behind, at most one node per stream holds
consumed entries beside unconsumed ones. An exact trim would only mark those entries
deleted inside the node, whose bytes Redis frees with the whole node either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ResponseError

from ..errors.failures import FailureLog
from .boundary import translated
from .client import Store, commands


def trim_floor(groups: Any, pending: Any, group: str) -> str | None:
    """The id below which every entry of a stream is consumed by ``group``, or None to keep
    the stream whole.

    ``groups`` is the stream's ``XINFO GROUPS`` reply and ``pending`` its ``XPENDING``
    summary for ``group``, both as redis-py parses them. The floor is the id just past the
    group's last delivered entry, or the oldest pending entry when that is older.
    """
    delivered = None
    for found in groups or ():
        if text(found.get("name")) == group:
            delivered = text(found.get("last-delivered-id"))
    if delivered is None or delivered == "0-0":
        return None
    ms, seq = id_key(delivered)
    past = f"{ms}-{seq + 1}"
    oldest = text(pending.get("min")) if isinstance(pending, dict) else None
    if oldest is not None and pending.get("pending"):
        return min(past, oldest, key=id_key)
    return past


async def trim_behind_group(redis: Store, stream: str, group: str) -> int:
    """Trim ``stream`` behind ``group`` (see the module's description); the number of
    entries removed (0 when the stream or the group does not exist)."""
    # One round trip, in this order (see the module's description of why it is safe).
    async with commands(redis).pipeline(transaction=False) as pipe:
        pipe.xinfo_groups(stream)
        pipe.xpending(stream, group)
        groups, pending = await pipe.execute(raise_on_error=False)
    for reply in (groups, pending):
        if isinstance(reply, ResponseError) and absent(reply):
            return 0  # no entry reached this stream yet, or no reader made the group
        if isinstance(reply, Exception):
            raise reply
    floor = trim_floor(groups, pending, group)
    if floor is None:
        return 0
    return await trim_below(redis, stream, floor)


async def trim_below(redis: Store, stream: str, floor: str) -> int:
    """``XTRIM stream MINID ~ floor LIMIT 0``: whole nodes below ``floor`` go, however many
    (an approximate trim stops after 100 nodes unless told ``LIMIT 0``)."""
    return int(
        await commands(redis).execute_command("XTRIM", stream, "MINID", "~", floor, "LIMIT", 0)
    )


def absent(error: BaseException) -> bool:
    """Whether ``error`` is a reply saying the stream or the group does not exist."""
    message = str(error)
    return isinstance(error, ResponseError) and (
        "no such key" in message.lower() or message.startswith("NOGROUP")
    )


def text(value: Any) -> str | None:
    """A reply's text (redis-py gives bytes or str, as the client decodes)."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@translated
async def trim_every(
    interval: float, trim: Callable[[], Awaitable[int]], what: str, log: logging.Logger
) -> None:
    """``await trim()`` every ``interval`` seconds, until cancelled; a failed round is logged
    in a line (summarised while it goes on, ``what`` naming the work) and the next one
    retries it: a trim is idempotent, and no user's data rides on it."""
    failures = FailureLog(log, what)
    while True:
        await asyncio.sleep(interval)
        try:
            removed = await trim()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logged; the next round retries
            failures.failed(exc)
        else:
            failures.succeeded()
            if removed:
                log.debug("%s: %d entries removed", what, removed)
