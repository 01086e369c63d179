"""Flow control: a client that sends faster than it may is slowed down, not refused.

A connection's requests are paced where they are read. After each frame, the
connection's :class:`Pace` (``rate_per_connection`` a second, bursts of twice that)
says how long to wait before the next frame is read; while the broker waits it does
not read the socket, so the client's writes back up in TCP, as any stream does. A
client that waits for each reply is thus never refused, however fast it goes: it only
goes at the rate. What is refused (-32005) is a connection that keeps more than
``max_requests_in_flight`` requests unanswered at once.

A client that pipelines faster than its pace is slowed, never cut off for it. The socket
is read on while the connection's frames wait for their pace: they wait in websockets'
queue, up to :func:`waiting_bound` frames (what the pace serves in ``max_pace`` seconds)
or ``max_queue_bytes``, and a request read past that is refused at once (-32005,
``rate_per_connection``), so each request is answered or refused within about
``max_pace``. The client's Pings and Pongs are thus read as they come, never held behind
its own requests: its Pings are answered (a websockets client closes a connection whose
Pong is 20 s late) and its Pongs reach the front's keepalive, which besides does not count
the time reading is held back (:mod:`.keepalive`). A frame with anything but requests in
it (a notification, such as a cancel, or an answer) is never refused: it waits its turn,
and a connection whose waiting frames pass ``max_queue_bytes`` that way is closed (1008).

A credential's requests are counted across the deployment in Redis
(:class:`TokenRates`): one counter a second per credential, which every node adds to in
leases of a tenth of the rate, so a node asks Redis a few times a second per busy
credential, not once a request. A frame whose credential has spent this second's
``rate_per_token`` waits for the next second; when none has room for it within
``max_pace`` seconds, its requests are refused (-32005, ``rate_per_token``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

from ...errors.failures import FailureLog
from ...store.client import Store
from ...store.keys import PREFIX
from ...store.quotas import RateCounters

log = logging.getLogger(__name__)

WINDOW_TTL = 5
"""Seconds a per-second counter outlives its second (clocks of nodes differ a little)."""


@dataclass(slots=True)
class Pace:
    """``rate`` requests a second, bursts up to ``2 * rate``; a burst beyond it is owed."""

    rate: float
    tokens: float | None = None  # None: a full bucket
    stamp: float = field(default_factory=time.monotonic)

    def spend(self, requests: int) -> float:
        """Count ``requests`` in; the seconds to wait before reading on (0: read on now)."""
        now = time.monotonic()
        self.tokens = self._refilled(now) - requests
        self.stamp = now
        return -self.tokens / self.rate if self.tokens < 0 else 0.0

    def take(self, requests: int) -> bool:
        """:meth:`spend` when it would let ``requests`` in without a wait (True); False:
        nothing spent."""
        now = time.monotonic()
        tokens = self._refilled(now) - requests
        if tokens < 0:
            return False
        self.tokens, self.stamp = tokens, now
        return True

    def refund(self, requests: int) -> None:
        """Undo a :meth:`take` of ``requests`` (they were not let in after all)."""
        if self.tokens is not None:  # always, after a take
            self.tokens += requests

    def _refilled(self, now: float) -> float:
        capacity = 2 * self.rate
        tokens = capacity if self.tokens is None else self.tokens
        return min(capacity, tokens + (now - self.stamp) * self.rate)


def waiting_bound(rate: float, max_pace: float) -> int:
    """Frames a connection may have read and not yet taken (waiting for their pace) before a
    request read is refused: what its pace lets in within ``max_pace`` seconds, its burst
    included (at least 16, websockets' own queue)."""
    return max(16, math.ceil(rate * (max_pace + 2)))


def rate_key(subject: str, second: int) -> str:
    """The counter of one credential's requests in one second (all nodes add to it)."""
    return f"{PREFIX}:rate:{{{subject}}}:{second}"


class TokenRates:
    """Per-credential request budgets, counted in Redis across every node."""

    def __init__(self, redis: Store, rate: float) -> None:
        self.counters = RateCounters(redis)
        self.limit = max(1, int(rate))
        self.lease = max(1, self.limit // 10)
        self._leased: dict[str, tuple[int, int]] = {}  # subject -> (second, requests left)
        # Counting fails while Redis is away, for every request of every connection: one
        # line for the node, summarized, not one a request (requests are served meanwhile).
        self.failures = FailureLog(log, "counting requests for rate_per_token")

    def take_leased(self, subject: str, requests: int) -> bool:
        """:meth:`take` when what this node leased of the current second covers ``requests``
        (True: taken); False: nothing taken (:meth:`take` asks Redis for more)."""
        second = math.floor(time.time())
        leased_second, left = self._leased.get(subject, (second, 0))
        if leased_second != second or left < requests:
            return False
        self._leased[subject] = (second, left - requests)
        return True

    async def take(self, subject: str, requests: int) -> float:
        """Take ``requests`` from the credential's budget of this second: 0.0 if taken, else
        the seconds until the next second, when to try again (nothing was taken)."""
        now = time.time()
        second = math.floor(now)
        leased_second, left = self._leased.get(subject, (second, 0))
        if leased_second != second:
            left = 0
        if left < requests:
            want = max(self.lease, requests - left)
            key = rate_key(subject, second)
            total = await self.counters.add(key, want, WINDOW_TTL)
            before = total - want
            left += max(0, min(want, self.limit - before))
        if left < requests:
            self._leased[subject] = (second, left)
            return second + 1 - now
        self._leased[subject] = (second, left - requests)
        if len(self._leased) > 10_000:  # credentials gone quiet: forget their leases
            self._leased = {s: v for s, v in self._leased.items() if v[0] == second}
        return 0.0
