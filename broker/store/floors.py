"""Seqs never given twice: the floor each append passes, and what a rewound log looks like.

Redis replicates asynchronously: a failover to a replica that had not yet received the
master's last writes loses events the master acknowledged. The new master's log then ends
before seqs that appenders were told, and that watchers were sent. Were the next event given
the next seq after the log's end, it would reuse a lost event's seq in the same epoch, and
every watcher that saw the lost event would take the new one for a duplicate and skip it.

So each append passes a floor, the highest seq its process knows the session's log reached
(its own acknowledged appends, and, for a front, what its fan-out hub delivered), and the
append script gives the next event the seq after the larger of the floor and the stored
seq (``lua/append.lua``). A front whose fan-out hub finds a quiet session's log behind
what it handed out leaves that seq in the snapshot as a floor every appender's next event
goes past (``lua/floor.lua``): for an appender that never saw the lost seqs (an agent host
that took the session over). After a rewind the log skips the lost seqs: readers take a
seq the log does not hold as nothing there. The lost events stay lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..ops import metrics

log = logging.getLogger(__name__)

FloorSource = Callable[[str, str], int]
"""Given a tenant and a session id, the highest seq of its log someone here saw (0: none)."""

REMEMBERED = 100_000
"""Sessions whose floor a process remembers; past it the oldest remembered go first (a
session forgotten passes no floor until its next append, and is remembered again then)."""


class SeqFloors:
    """The highest seq each session's log reached, as this process knows it."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self.limit = limit
        self._reached: dict[str, int] = {}
        self._sources: list[FloorSource] = []

    def add_source(self, source: FloorSource) -> None:
        """Ask ``source`` too for the floor of a single append (:meth:`asked`): a front's
        fan-out hub knows the seqs it delivered of the sessions it follows."""
        self._sources.append(source)

    def floor(self, session_id: str) -> int:
        """The highest seq this process's appends were acknowledged for (0: none known)."""
        return self._reached.get(session_id, 0)

    def asked(self, tenant: str, session_id: str) -> int:
        """:meth:`floor`, or higher when a source saw more of the log."""
        known = self._reached.get(session_id, 0)
        for source in self._sources:
            known = max(known, source(tenant, session_id))
        return known

    def reached(self, session_id: str, seq: int) -> None:
        """An append of the session's was acknowledged at ``seq``."""
        reached = self._reached
        if reached.get(session_id, 0) < seq:
            if session_id not in reached and len(reached) >= self.limit:
                del reached[next(iter(reached))]
            reached[session_id] = seq

    def forget(self, session_id: str) -> None:
        """No floor for this session any more (its log is gone)."""
        self._reached.pop(session_id, None)


def rewound(session_id: str, stored: int, floor: int, *, found_by: str) -> None:
    """Report a session's log found behind what was acknowledged or delivered (``found_by``:
    ``append`` or ``fanout``): one warning line and ``acp_broker_log_rewinds_total``."""
    metrics.LOG_REWINDS.labels(found_by).inc()
    if found_by == "append":
        what, then = "acknowledged", f"this event took seq {floor + 1}"
    else:
        what, then = "delivered here", f"left as its floor: the next event takes seq {floor + 1}"
    log.warning(
        "session %s: its log ends at seq %d, behind seq %d %s: Redis lost acknowledged "
        "writes (a failover to a replica that had not received them); %s",
        session_id,
        stored,
        floor,
        what,
        then,
    )
