"""A role's watch over its store: the start-up checks, the readiness check, the probe that
makes requests fail fast while the store is away (:mod:`.breaker`), the warning about an
evicting store the operator allowed.

Every role (a front, an agent host, a projector, ``serve`` with all three) holds one::

    guard = StoreGuard(redis, settings)
    await guard.start()              # refuses a store that would lose data (StoreRefused)
    health.add("redis", guard.ready)
    ...
    await guard.stop()
"""

from __future__ import annotations

import asyncio
import contextlib

from ..config import Settings
from ..loops import cancel_and_wait
from .breaker import breaker_of
from .client import Store
from .preflight import StoreFacts, preflight, warn_while_evicting
from .readiness import StoreReadiness


class StoreGuard:
    """The start-up checks and readiness of one process's store."""

    def __init__(self, redis: Store, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self.ready = StoreReadiness(redis, allow_evicting=settings.allow_evicting_store)
        """The ``redis`` readiness check."""
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def facts(self) -> StoreFacts:
        return self.ready.facts

    async def start(self) -> None:
        """Run the start-up checks (see :mod:`.preflight`)."""
        url = self.settings.redis_url or ""
        self.ready.facts = await preflight(
            self.redis,
            allow_evicting=self.settings.allow_evicting_store,
            tls=url.startswith("rediss"),
        )
        policy = self.facts.policy
        if policy is not None and self.facts.evicting:
            warning = warn_while_evicting(policy)
            self._tasks.append(asyncio.create_task(warning, name="evicting store warning"))
        breaker = breaker_of(self.redis)
        if breaker is not None:
            probe = breaker.watch(self.redis)
            self._tasks.append(asyncio.create_task(probe, name="store probe"))

    async def stop(self) -> None:
        with contextlib.suppress(Exception):  # stopping: a probe that failed has said so
            await cancel_and_wait(*self._tasks)
        self._tasks.clear()
