"""Following a Sentinel set's failover at once, in every process.

redis-py asks the Sentinels where the master is only when it opens a connection; the
connections a process holds (its pool's, a subscriber's, a blocked read's) keep talking
to the old master after a failover until that server refuses a write. After a
``SENTINEL FAILOVER`` the old master goes on taking writes as a master until the Sentinels
turn it into a replica (10-20 s later), and its resync then drops them all: an agent host
renewed its lease and appended a prompt's events there while the new master let the
lease lapse, a session made there vanished, and a front's subscriber stayed deaf to the
new master's events.

A :class:`SwitchFollower` per client (started with its pool's first connection) listens to
every Sentinel's failover events:

* from the start of a failover (``+try-failover``, ``+elected-leader``, ``+selected-slave``,
  ``+failover-state-…``, ``+promoted-slave``) until the switch is followed, the pool hands
  out no connection (:meth:`~broker.compat.redis.BlockingSentinelPool.hold`, re-armed by
  each event for :data:`HOLD` seconds; an aborted failover, ``-failover-abort-…``, ends
  it): commands fail at once with "failing over, try again" rather than be acknowledged
  by an old master whose resync drops them. A Sentinel announces each step before it
  takes it (the replica is promoted on its next tick, ~0.1 s later).
* on ``+switch-master``, and every :data:`POLL` seconds, it asks every Sentinel for the
  master's address and configuration epoch. The highest epoch wins (a Sentinel that has
  not heard of the failover yet names the old master, with an older epoch). When it names
  another server the pool follows it
  (:meth:`~broker.compat.redis.BlockingSentinelPool.follow`): new connections go there,
  and every connection to another server is closed, those in use included, so a command
  in flight fails as a lost connection and is sent again to the new master (the client's
  retry), and a subscriber subscribes again there; a connection still open elsewhere (one
  being opened to the old master at the switch) reconnects before its next command.

A Sentinel that stops answering is listened to again after a pause; the poll needs only
one of them to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..compat.redis import BlockingSentinelPool
from ..errors.failures import describe
from ..loops import cancel_and_wait

log = logging.getLogger(__name__)

SWITCH = "+switch-master"
"""A Sentinel's announcement of a new master (``NAME OLDIP OLDPORT NEWIP NEWPORT``)."""
STEPS = ("+try-failover", "+elected-leader", "+selected-slave", "+promoted-slave", "+failover-*")
"""Patterns of a Sentinel's events while a failover is under way (``+failover-state-…``,
``+failover-end`` …); each names the master and its address (``… NAME IP PORT``): one
about a master the pool has already left is not heeded."""
ABORTED = "-failover-abort-*"
"""A failover given up (not elected, no good replica, timed out): the master stays."""
HOLD = 5.0
"""Seconds without a further step after which commands go to the old master again."""
POLL = 1.0
"""Seconds between two rounds of questions to the Sentinels without an announcement."""
ANSWER_TIMEOUT = 1.0
"""Seconds a Sentinel has to answer a round (a stalled one is left out of it)."""
RELISTEN_PAUSE = 0.5
"""Seconds before listening again to a Sentinel that failed."""

Address = tuple[str, int]


class SwitchFollower:
    """Keeps one pool on the master the Sentinels name (see the module)."""

    def __init__(self, sentinels: list[Redis], master: str) -> None:
        self.sentinels = sentinels
        """Clients of each Sentinel (redis-py's ``Sentinel.sentinels``)."""
        self.master = master
        self.switches = 0
        """How many times the pool was moved to another master."""
        self._epoch = -1
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, pool: BlockingSentinelPool) -> None:
        """Follow on behalf of ``pool`` until :meth:`stop` (again: nothing)."""
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._run(pool), name="sentinel switch follower")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(Exception):  # stopping: its failures were logged
                await cancel_and_wait(task)

    async def _run(self, pool: BlockingSentinelPool) -> None:
        listeners = [
            asyncio.create_task(self._listen(sentinel, pool), name="sentinel events")
            for sentinel in self.sentinels
        ]
        try:
            while True:
                try:
                    await self.check(pool)
                except Exception:  # a bug: said once a round, and the follower goes on
                    log.exception("following the Sentinels of %s failed", self.master)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            await cancel_and_wait(*listeners)

    async def _listen(self, sentinel: Redis, pool: BlockingSentinelPool) -> None:
        """Hear ``sentinel``'s failover events until cancelled."""
        while True:
            pubsub = sentinel.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(SWITCH)
                await pubsub.psubscribe(*STEPS, ABORTED)
                while True:
                    message = await pubsub.get_message(timeout=POLL)
                    if message is not None:
                        self._heard(message, pool)
            except (RedisError, OSError) as exc:
                log.debug("listening to a Sentinel of %s failed: %s", self.master, describe(exc))
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
            await asyncio.sleep(RELISTEN_PAUSE)

    def _heard(self, message: dict[str, Any], pool: BlockingSentinelPool) -> None:
        channel, words = _text(message.get("channel")), _text(message.get("data")).split()
        if self.master not in words:
            return  # another master these Sentinels watch
        at = words.index(self.master)  # the master's name, then its address
        if (
            channel != SWITCH
            and pool.followed is not None
            and words[at + 1 : at + 3]
            != [
                pool.followed[0],
                str(pool.followed[1]),
            ]
        ):
            return  # about a master already left (a Sentinel late to try, or to give up)
        if channel == SWITCH:
            self._wake.set()  # ask the Sentinels now
        elif channel.startswith("-failover-abort"):
            pool.hold(0)
            log.warning("the Sentinels gave up failing %s over (%s)", self.master, channel)
        else:
            if not pool.held_until:
                log.warning("the Sentinels are failing %s over (%s)", self.master, channel)
            pool.hold(HOLD)

    async def check(self, pool: BlockingSentinelPool) -> None:
        """Ask the Sentinels; move ``pool`` to the master of the highest epoch if another
        server (its connections closed then)."""
        named = await self.newest()
        if named is None:
            return
        epoch, address = named
        if epoch < self._epoch:
            return  # only Sentinels that have not heard of a failover answered
        self._epoch = epoch
        if await pool.follow(address):
            self.switches += 1
            log.warning(
                "the Sentinels name a new master for %s: %s:%s (epoch %s); following it, "
                "the connections to the old one closed",
                self.master,
                *address,
                epoch,
            )

    async def newest(self) -> tuple[int, Address] | None:
        """(configuration epoch, address) of the master as the Sentinel of the highest
        epoch names it; None when none answers."""
        answers = await asyncio.gather(
            *(self._ask(sentinel) for sentinel in self.sentinels), return_exceptions=True
        )
        named = [answer for answer in answers if isinstance(answer, tuple)]
        return max(named, key=lambda answer: answer[0]) if named else None

    async def _ask(self, sentinel: Redis) -> tuple[int, Address]:
        async with asyncio.timeout(ANSWER_TIMEOUT):
            state = cast(dict[str, Any], await sentinel.sentinel_master(self.master))
        return int(state["config-epoch"]), (str(state["ip"]), int(state["port"]))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")
