"""Following a Sentinel set's switch of master at once, in every process.

redis-py asks the Sentinels where the master is only when it opens a connection; the
connections a process holds (its pool's, a subscriber's, a blocked read's) keep talking
to the old master after a failover until that server refuses a write. After a
``SENTINEL FAILOVER`` the old master goes on taking writes as a master until the Sentinels
turn it into a replica (they look at it every 10 s), and its resync then drops them all:
an agent host renewed its lease and appended a prompt's events there while the new master
let the lease lapse, and a front's subscriber stayed deaf to the new master's events.

A :class:`SwitchFollower` per client (started with its pool's first connection) listens
to one Sentinel's ``+switch-master`` messages and, on each message and every
:data:`POLL` seconds, asks every Sentinel for the master's address and its configuration
epoch. The highest epoch wins (a Sentinel that has not yet heard of the failover still
names the old master, with an older epoch). When it names another server, the pool
follows it (:meth:`~broker.compat.redis.BlockingSentinelPool.follow`): new connections go
there and every connection to another server is closed, the ones in use included, so a
command in flight fails as a lost connection and is sent again to the new master (the
client's retry), and a subscriber subscribes again there. Each poll closes any
connection still elsewhere (one being opened to the old master at the switch).

A Sentinel that stops answering is replaced by the next one for listening; the poll needs
only one of them to answer.
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
"""The channel on which a Sentinel announces a new master (``NAME OLDIP OLDPORT NEWIP
NEWPORT``)."""
POLL = 1.0
"""Seconds between two rounds of questions to the Sentinels without a message."""
ANSWER_TIMEOUT = 1.0
"""Seconds a Sentinel has to answer a round (a stalled one is left out of it)."""
RELISTEN_PAUSE = 0.5
"""Seconds before listening to the next Sentinel once one failed."""

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
        self._task: asyncio.Task[None] | None = None

    def start(self, pool: BlockingSentinelPool) -> None:
        """Follow on behalf of ``pool`` until :meth:`stop` (again: nothing)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(pool), name="sentinel switch follower")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(Exception):  # stopping: its failures were logged
                await cancel_and_wait(task)

    async def _run(self, pool: BlockingSentinelPool) -> None:
        turn = 0
        while True:
            sentinel = self.sentinels[turn % len(self.sentinels)]
            try:
                await self._listen(sentinel, pool)
            except (RedisError, OSError) as exc:
                log.debug("listening to a Sentinel for %s failed: %s", SWITCH, describe(exc))
            except Exception:  # a bug: said once a turn, and the follower goes on
                log.exception("following the Sentinels of %s failed", self.master)
            turn += 1
            await asyncio.sleep(RELISTEN_PAUSE)

    async def _listen(self, sentinel: Redis, pool: BlockingSentinelPool) -> None:
        """Check on each message of ``sentinel``'s and every :data:`POLL` seconds, until
        the Sentinel fails."""
        pubsub = sentinel.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(SWITCH)
            while True:
                await self.check(pool)
                await pubsub.get_message(timeout=POLL)
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    async def check(self, pool: BlockingSentinelPool) -> None:
        """Ask the Sentinels; move ``pool`` to the master of the highest epoch if another
        server, and close its connections still elsewhere."""
        named = await self.newest()
        if named is None:
            return
        epoch, address = named
        if epoch < self._epoch:
            return  # only Sentinels that have not heard of a failover answered
        self._epoch = epoch
        before = pool.followed
        closed = await pool.follow(address)
        if before is not None and before != address:
            self.switches += 1
            log.warning(
                "the Sentinels name a new master for %s: %s:%s (epoch %s); following it, "
                "%d connection(s) to the old one closed",
                self.master,
                *address,
                epoch,
                closed,
            )
        elif closed:
            log.info("closed %d connection(s) opened to the old master of %s", closed, self.master)

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
