"""What wakes a GET stream open on this front: news of its scope in the store.

A front that stores a connection's messages rings the stream of their scope (here, or on
its node by pub/sub). Rung here, the messages are handed along with the bell, so the
stream sends them without reading them back from the store; it reads the store whenever
what it was handed does not follow on from where it is (it was opened after them, a hand
overflowed, another front stored them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

HANDED_MAX = 1024
"""Messages a bell holds for its stream; past them the stream reads the store instead."""


class Bell:
    """One GET stream's bell, and the messages handed to it since it last took them."""

    __slots__ = ("event", "handed", "overflowed")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.handed: list[tuple[int, str]] = []
        self.overflowed = False

    def ring(self, messages: Sequence[tuple[int, str]] = ()) -> None:
        """News is stored: ``messages`` (cursor, text) are handed along when given."""
        if messages:
            if len(self.handed) + len(messages) > HANDED_MAX:
                self.overflowed = True
            else:
                self.handed.extend(messages)
        self.event.set()

    def take(self, after: int) -> list[tuple[int, str]] | None:
        """The handed messages that follow cursor ``after`` one by one, from ``after + 1``;
        None when they do not (the stream reads the store)."""
        handed, self.handed = self.handed, []
        overflowed, self.overflowed = self.overflowed, False
        rows = [row for row in handed if row[0] > after]
        if overflowed or not rows:
            return None
        expected = after + 1
        for cursor, _ in rows:
            if cursor != expected:
                return None
            expected += 1
        return rows
