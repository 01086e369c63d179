"""Announcing that a tenant's session index changed: on :data:`~.keys.INDEX_CHANNEL` (once
per tenant per round trip; one that failed is owed, and sent with the next), and to a local
hook at once."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from .client import Store, commands
from .keys import INDEX_CHANNEL


class IndexAnnouncer:
    """Tells who caches pages of a tenant's index that it changed."""

    def __init__(self, redis: Store, changed: Callable[[str], None] | None) -> None:
        self.redis = commands(redis)
        self.changed = changed
        """Called with a tenant's name as soon as a write of its index returned (or failed:
        it may have been made), before the write's caller goes on."""
        self._owed: dict[str, int] = {}
        """Tenants whose announcement failed (each with the count it was owed at), sent with
        the next write's."""
        self._owings = 0

    async def announce(self, tenants: Collection[str]) -> None:
        """Publish that the index of each of ``tenants`` changed (and any announcement owed):
        one message per tenant, in one round trip."""
        names, owed = self.announcing(tenants)
        if not names:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.spublish(INDEX_CHANNEL, name)
                await pipe.execute()
        except BaseException:
            self.owe(names)
            raise
        self.paid(owed)

    def announcing(self, tenants: Iterable[str]) -> tuple[list[str], dict[str, int]]:
        """The tenants to announce now (``tenants`` and those owed), and the owed ones as
        they stood (:meth:`paid` forgets only those not owed again since)."""
        owed = dict(self._owed)
        return sorted({*tenants, *owed}), owed

    def owe(self, tenants: Iterable[str]) -> None:
        self._owings += 1
        for tenant in tenants:
            self._owed[tenant] = self._owings

    def paid(self, owed: Mapping[str, int]) -> None:
        for tenant, mark in owed.items():
            if self._owed.get(tenant) == mark:
                del self._owed[tenant]

    def owing(self) -> bool:
        """Whether an announcement is owed (one failed, and none was sent since)."""
        return bool(self._owed)

    def tell(self, tenants: Iterable[str]) -> None:
        """The local hook, for each tenant whose index was (or may have been) written."""
        if self.changed is not None:
            for tenant in tenants:
                self.changed(tenant)
