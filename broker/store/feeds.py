"""The partitions' change feeds as their readers' consumer group sees them: made, claimed
from dead readers, measured, trimmed. Reading them is :class:`~.groups.GroupReads`'s;
what a notice says, :mod:`.index`'s."""

from __future__ import annotations

from .boundary import port
from .client import Store, commands
from .errors import group_exists
from .groups import Entries
from .keys import PARTITIONS, feed_key
from .streams import trim_behind_group


def all_feeds() -> list[str]:
    """Every partition's feed."""
    return [feed_key(partition) for partition in range(PARTITIONS)]


@port
class ChangeFeeds:
    """The change feeds ``feeds`` (default: every partition's) and their group ``group``."""

    def __init__(self, redis: Store, group: str, feeds: list[str] | None = None) -> None:
        self.redis = commands(redis)
        self.group = group
        self.feeds = all_feeds() if feeds is None else feeds

    async def ensure_groups(self) -> None:
        """Make the group on every feed (and the feed), from its start; one that exists
        is left as it is. One round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for feed in self.feeds:
                pipe.xgroup_create(feed, self.group, id="0", mkstream=True)
            results = await pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, Exception) and not group_exists(result):
                raise result

    async def claim(self, consumer: str, idle_ms: int, count: int) -> list[tuple[str, Entries]]:
        """Give ``consumer`` the notices another consumer read over ``idle_ms`` ago and never
        acknowledged (up to ``count`` a feed): the feeds that had some, with them."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for feed in self.feeds:
                pipe.xautoclaim(feed, self.group, consumer, idle_ms, count=count)
            replies = await pipe.execute()
        claimed = [(feed, reply[1]) for feed, reply in zip(self.feeds, replies, strict=True)]
        return [(feed, entries) for feed, entries in claimed if entries]

    async def backlog(self) -> int:
        """The notices the group has not delivered yet, over every feed (``XINFO GROUPS``
        lag; a feed or group that does not exist counts none)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for feed in self.feeds:
                pipe.xinfo_groups(feed)
            replies = await pipe.execute(raise_on_error=False)
        backlog = 0
        for groups in replies:
            for group in groups if isinstance(groups, list) else []:
                if group.get("name") == self.group:
                    backlog += int(group.get("lag") or 0)
        return backlog

    async def nonempty(self) -> list[str]:
        """The feeds that hold notices (their lengths read in one round trip)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for feed in self.feeds:
                pipe.xlen(feed)
            lengths = await pipe.execute()
        return [feed for feed, length in zip(self.feeds, lengths, strict=True) if length]

    async def trim(self, feed: str) -> int:
        """Trim ``feed`` behind the group (:func:`~.streams.trim_behind_group`); the notices
        removed."""
        return await trim_behind_group(self.redis, feed, self.group)
