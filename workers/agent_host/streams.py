"""Trimming the agent hosts' command streams: a host's inbox and the shared queue keep only
what is not read (or not acknowledged) yet.

Fronts add a command to a host's inbox (``acpb:host:<id>:inbox``, commands for sessions it
holds, and answers to its agents' requests) or to the shared queue (``acpb:hosts:queue``,
new sessions and sessions no host holds). Both were capped only by ``INBOX_MAXLEN``
(10,000 commands, about 445 bytes each): every command ever sent stayed, in the hundreds
of bytes per session. What each entry is needed for, and so when it goes:

* **The inbox** has one reader, its host, which reads it in order (``XREAD``, no group)
  from where it started. An entry it has read is done with: a front that got no
  acknowledgement sends a *new* copy, and the run-once guarantee of a command that creates
  a session rests on its taken mark (``acpb:hosts:taken:<rid>``, ``SET NX``), not on the
  stream. Each round trims the inbox up to just past the last entry read, and sets it to
  expire :data:`INBOX_TTL` seconds later (every round sets it again): the inbox of a host
  that stopped goes with it, since nothing else reads it.
* **The queue** is read by the hosts' consumer group and acknowledged as it is read; it is
  trimmed behind the group (:func:`broker.store.streams.trim_behind_group`): up to the last
  delivered entry, never past a pending one. An entry still pending after
  :data:`PENDING_HORIZON` seconds is one whose acknowledgement failed (a host logs that and
  runs the command all the same; nobody claims queue entries again): it is acknowledged
  here, so that it holds the trim back no longer.

The bound: a stream holds what is not read (or acknowledged) yet, the entries read in the
last :data:`TRIM_INTERVAL` seconds, and beside them at most one stream node (100 entries,
4 KB) of consumed ones (the trim is approximate: see :mod:`broker.store.streams`). Idle,
both are empty. Every host trims its own inbox and the queue (idempotent).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.store.bus import CommandBus
from broker.store.client import Store
from broker.store.streams import trim_every

log = logging.getLogger(__name__)

TRIM_INTERVAL = 10.0
"""Seconds between two trims of a host's inbox and of the shared queue."""

INBOX_TTL = 120.0
"""Seconds after the last trim by its host at which an inbox expires (set again each round,
so a live host's inbox never does)."""

PENDING_HORIZON = 60.0
"""Seconds after which a queue entry still pending is one whose acknowledgement failed."""


async def trim_inbox(redis: Store, inbox: str, read_up_to: str | None) -> int:
    """Trim a host's inbox up to and including ``read_up_to`` (the last entry its host
    read; None: none yet), and set it to expire after :data:`INBOX_TTL`; entries removed."""
    return await CommandBus(redis).trim_inbox(inbox, read_up_to, int(INBOX_TTL * 1000))


async def trim_queue(redis: Store, group: str, *, horizon: float = PENDING_HORIZON) -> int:
    """Acknowledge the queue's entries pending for over ``horizon`` seconds, then trim the
    queue behind ``group``; entries removed."""
    bus = CommandBus(redis)
    acknowledged = await bus.ack_stale(group, horizon)
    if acknowledged:
        log.info("acknowledged %d queued commands whose acknowledgement had failed", acknowledged)
    return await bus.trim_queue(group)


async def run_command_trimming(
    redis: Store,
    inbox: str,
    read_up_to: Callable[[], str | None],
    group: str,
    *,
    interval: float | None = None,
) -> None:
    """Trim ``inbox`` (read up to ``read_up_to()``) and the shared queue (behind ``group``)
    every ``interval`` seconds (None: :data:`TRIM_INTERVAL`), until cancelled; a failed
    round is logged in a line (summarised while it goes on) and the next one retries it."""

    async def trim() -> int:
        return await trim_inbox(redis, inbox, read_up_to()) + await trim_queue(redis, group)

    pause = TRIM_INTERVAL if interval is None else interval
    await trim_every(pause, trim, "trimming the command streams", log)
