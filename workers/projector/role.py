"""The projector role: the projector's loop, the change feeds' trim and, with an archive
store, the archiving role, as the loops of one :class:`~broker.lifetimes.RoleLoops`.

``acp-broker worker projector`` runs it alone; ``serve`` runs it beside a front and an agent
host. Either way it is an async context manager: its loops run while the block does, a loop
that fails is logged and started again with backoff (its readiness check says so
meanwhile), and leaving the block stops them all.
"""

from __future__ import annotations

from broker.config import Settings
from broker.lifetimes import RoleLoops
from broker.store.archive import ArchiveStore
from broker.store.client import Store

from .archiving import archiving_role
from .feeds import run_feed_trimming
from .worker import configured_projector


class ProjectorRole:
    """The projector's loops (see the module)."""

    name = "projector"

    def __init__(
        self, redis: Store, settings: Settings, *, archive: ArchiveStore | None = None
    ) -> None:
        self.loops = RoleLoops("projector")
        # One consumer for the role's life: restarted, it reads first what it left pending.
        self.loops.add("projector", configured_projector(redis, settings).run)
        self.loops.add(
            "feed trimming", lambda: run_feed_trimming(redis, settings.feed_trim_interval)
        )
        if archive is not None:
            self.loops.add("archiving", lambda: archiving_role(redis, archive, settings))

    async def start(self) -> None:
        await self.loops.start()

    async def stop(self, *, hand_over: bool = False) -> None:
        """Stop the loops (``hand_over``: nothing to hand over, a projector holds no session)."""
        await self.loops.stop()

    async def __aenter__(self) -> ProjectorRole:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
