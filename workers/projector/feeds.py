"""Trimming the partitions' change feeds behind the projectors' consumer group.

Every appended event adds a notice (about 71 bytes) to its partition's feed. ``feed_maxlen``
caps each feed, but at 256 partitions that cap is far more than the projectors ever need
back: once every log is archived, the feeds were most of what stayed in Redis. A notice
is needed until the group has delivered it and a projector has acknowledged it, so a feed
is trimmed up to the older of the group's last delivered id and its oldest pending entry.

Why that bound is safe, with appends and reads racing the trim: the group delivers a
feed's entries in id order, so every entry below its last delivered id (read first) was
delivered before the read, and any such entry not pending when ``XPENDING`` answers
(read second) has been acknowledged. A feed whose group is missing is never trimmed: a
projector that makes the group reads the feed from its start.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.exceptions import ResponseError

from broker.store.client import Store
from broker.store.keys import PARTITIONS, feed_key

from .worker import GROUP

log = logging.getLogger(__name__)


def trim_floor(groups: Any, pending: Any) -> str | None:
    """The id below which every notice of a feed is consumed, or None to keep it whole.

    ``groups`` is the feed's ``XINFO GROUPS`` reply and ``pending`` its ``XPENDING``
    summary for :data:`GROUP`, both as redis-py parses them.
    """
    delivered = None
    for group in groups or ():
        if _text(group.get("name")) == GROUP:
            delivered = _text(group.get("last-delivered-id"))
    if delivered is None or delivered == "0-0":
        return None
    oldest = _text(pending.get("min")) if isinstance(pending, dict) else None
    if oldest is not None and pending.get("pending"):
        return min(delivered, oldest, key=_id_key)
    return delivered


async def trim_feed(redis: Store, feed: str) -> int:
    """Trim one feed behind the group; the number of notices removed."""
    # One round trip, in this order (see the module's description of why it is safe).
    async with redis.pipeline(transaction=False) as pipe:
        pipe.xinfo_groups(feed)
        pipe.xpending(feed, GROUP)
        groups, pending = await pipe.execute(raise_on_error=False)
    for reply in (groups, pending):
        if isinstance(reply, ResponseError) and _absent(reply):
            return 0  # no event reached this partition yet, or no projector made the group
        if isinstance(reply, Exception):
            raise reply
    floor = trim_floor(groups, pending)
    if floor is None:
        return 0
    # Approximate: Redis drops whole nodes of the stream, cheap, and never past ``floor``.
    return int(await redis.xtrim(feed, minid=floor, approximate=True))


async def trim_feeds(redis: Store) -> int:
    """Trim every partition's feed once; the number of notices removed."""
    removed = 0
    for partition in range(PARTITIONS):
        removed += await trim_feed(redis, feed_key(partition))
    return removed


async def run_feed_trimming(redis: Store, interval: float) -> None:
    """Trim every feed every ``interval`` seconds, until cancelled; a failed round is
    logged, and the next one retries it (a trim is idempotent)."""
    while True:
        await asyncio.sleep(interval)
        try:
            removed = await trim_feeds(redis)
        except asyncio.CancelledError:
            raise
        except Exception:  # no user's data rides on a trim: log it, and the next round retries
            log.exception("trimming the change feeds failed; the next round retries it")
        else:
            if removed:
                log.debug("trimmed %d consumed change notices", removed)


def _absent(error: ResponseError) -> bool:
    text = str(error)
    return "no such key" in text.lower() or text.startswith("NOGROUP")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
