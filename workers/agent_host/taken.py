"""Commands that create a session run once per call id, and are always run or answered.

A front sends a command again when no acknowledgement came within its ``ack_timeout``; a
copy of a command a host runs already must not make a second session. So the first host to
take a creating command marks it in Redis (``SET NX`` on
:func:`~broker.store.keys.command_taken_key`), and the mark says what became of it:

* ``run:<host id>`` while that host runs it, with a short TTL the host keeps extending: when
  the host dies (or its run is cancelled, which deletes the mark) the mark lapses within
  :data:`RUNNING_TTL_MS`, and the next copy runs it;
* ``done:<reply>`` once it was answered, kept :data:`DONE_TTL_MS`: a copy is answered with
  the same reply (the first may not have reached its front: Redis restarting, say).

A mark Redis lost (it came back empty) is no mark: the copy runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from broker.errors.failures import describe
from broker.store.bus import CommandMarks
from broker.store.client import Store
from broker.store.errors import StoreError
from broker.store.retry import retrying

log = logging.getLogger(__name__)

RUNNING_TTL_MS = 6_000
"""How long a running command's mark outlives its host's last sign of life."""
DONE_TTL_MS = 600_000
"""How long an answered command's reply is kept for its copies: far past the time a front
goes on sending it again (its ``route_deadline``, 30 s by default)."""
RUNNING = "run:"
DONE = "done:"


class TakenMarks:
    """The marks of the creating commands one agent host takes."""

    def __init__(self, redis: Store, host_id: str, *, write_timeout: float = 5.0) -> None:
        self.store = CommandMarks(redis)
        self.host_id = host_id
        self.write_timeout = write_timeout

    async def take(self, rid: str) -> str | None:
        """Mark ``rid`` as run by this host: None when it is this host's to run now, else
        the mark already there (see the module). When Redis cannot say, the command runs:
        its own writes then meet the same store."""
        mine = RUNNING + self.host_id
        try:
            if await self.store.claim(rid, mine, RUNNING_TTL_MS):
                return None
            mark = await self.store.get(rid)
        except (StoreError, OSError) as exc:
            log.warning("could not mark command %s as taken (%s); running it", rid, describe(exc))
            return None
        if mark is None:  # lapsed in between: take it again
            return await self.take(rid)
        return mark

    def mine(self, mark: str) -> bool:
        """Whether ``mark`` says this host runs the command."""
        return mark == RUNNING + self.host_id

    @contextlib.asynccontextmanager
    async def running(self, rid: str) -> AsyncIterator[None]:
        """Keep ``rid``'s mark alive while the block runs it; a block that ends with an
        exception (a cancellation: the host stopping) deletes the mark, for a copy to run."""
        keeper = asyncio.ensure_future(self._keep(rid))
        try:
            yield
        except BaseException:
            with contextlib.suppress(StoreError, OSError):  # else it lapses by itself
                await self.store.clear(rid)
            raise
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def _keep(self, rid: str) -> None:
        while True:
            await asyncio.sleep(RUNNING_TTL_MS / 3000)
            with contextlib.suppress(StoreError, OSError):  # the next beat tries again
                await self.store.extend(rid, RUNNING_TTL_MS)

    async def done(self, rid: str, reply: str) -> None:
        """``rid`` was answered with ``reply`` (encoded): kept for its copies."""
        try:
            await retrying(
                lambda: self.store.put(rid, DONE + reply, DONE_TTL_MS),
                self.write_timeout,
            )
        except (StoreError, OSError) as exc:  # a copy then finds the running mark lapse, and runs
            log.warning("could not keep the reply to command %s: %s", rid, describe(exc))


def kept_reply(mark: str) -> str | None:
    """The reply an answered command's mark holds (encoded); None for a running one."""
    return mark.removeprefix(DONE) if mark.startswith(DONE) else None
