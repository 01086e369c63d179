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

from ..config import Settings
from ..lifetimes import RoleLoops
from .boundary import port
from .breaker import breaker_of
from .client import Store
from .preflight import StoreFacts, preflight, warn_while_evicting
from .readiness import StoreReadiness


@port
class StoreGuard:
    """The start-up checks and readiness of one process's store."""

    def __init__(self, redis: Store, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self.ready = StoreReadiness(redis, allow_evicting=settings.allow_evicting_store)
        """The ``redis`` readiness check."""
        self.loops = RoleLoops("store guard")
        """The store probe (and the evicting store's warning), once started."""

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
            self.loops.add("evicting store warning", lambda: warn_while_evicting(policy))
        breaker = breaker_of(self.redis)
        if breaker is not None:
            self.loops.add("store probe", lambda: breaker.watch(self.redis))
        await self.loops.start()

    async def stop(self) -> None:
        await self.loops.stop()
