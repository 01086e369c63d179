"""Trimming the partitions' change feeds behind the projectors' consumer group.

Every appended event adds a notice (about 71 bytes) to its partition's feed. ``feed_maxlen``
caps each feed, but at 256 partitions that cap is far more than the projectors ever need
back: once every log is archived, the feeds were most of what stayed in Redis. A notice
is needed until the group has delivered it and a projector has acknowledged it, so a feed
is trimmed behind the group (:mod:`broker.store.streams`, which says why that is safe and
the bound on what stays): once every notice is acknowledged, a feed holds none.
"""

from __future__ import annotations

import logging

from broker.store.client import Store
from broker.store.feeds import ChangeFeeds
from broker.store.streams import trim_every

from .worker import GROUP

log = logging.getLogger(__name__)


async def trim_feed(redis: Store, feed: str) -> int:
    """Trim one feed behind the projectors' group; the number of notices removed."""
    return await ChangeFeeds(redis, GROUP).trim(feed)


async def trim_feeds(redis: Store) -> int:
    """Trim every partition's feed once; the number of notices removed. The feeds' lengths
    are read first, all in one pipeline: an empty feed (every idle one, once trimmed) has
    nothing to trim, and its look behind the group would cost two commands (512 commands a
    round, most of an idle projector's on a cluster)."""
    feeds = ChangeFeeds(redis, GROUP)
    removed = 0
    for feed in await feeds.nonempty():
        removed += await feeds.trim(feed)
    return removed


async def run_feed_trimming(redis: Store, interval: float) -> None:
    """Trim every feed every ``interval`` seconds, until cancelled; a failed round is
    logged in a line (summarised while it goes on), and the next one retries it (a trim is
    idempotent)."""
    await trim_every(interval, lambda: trim_feeds(redis), "trimming the change feeds", log)
