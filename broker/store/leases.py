"""Session leases: which agent host runs a session, and the fencing token that proves it.

A host takes a session's lease before running it and renews it while it does.
Taking a free lease bumps the session's fencing token; the append script only
accepts appends carrying the current token, so a host that lost its lease (it
stalled, or was presumed dead) can never write to the log again: two hosts
never run the same session at once.

Every held lease is also listed in one sorted set scored by its expiry, which
is how surviving hosts find the sessions of a host that died.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from redis.exceptions import ResponseError

from .boundary import port
from .client import Store, commands
from .errors import no_session
from .keys import SessionKeys, leases_key
from .log import SessionMissing
from .scripts import call_each


class HeldElsewhere(Exception):
    """Another host holds the session's lease."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"held by agent host {holder}")
        self.holder = holder


@dataclass(frozen=True, slots=True)
class Renewal:
    """What a renewal found: the sessions whose lease another host holds now (``lost``),
    and those given up because their log was archived (``archived``: idle, no host needs
    to hold them; ``lease.lua`` deleted their lease)."""

    lost: list[tuple[str, str]]
    archived: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Lease:
    tenant: str
    session_id: str
    fence: str


def _member(tenant: str, session_id: str) -> str:
    return f"{tenant}\t{session_id}"


async def held_or_due(redis: Store, tenant: str, session_id: str) -> bool:
    """Whether a host holds the session or one is due to take it over: its lease is listed
    (the listing outlives a lease key that lapsed under a late renewal, or with its host,
    until the session is let go). A missing lease key is then a gap, not "nobody"."""
    score = await commands(redis).zscore(leases_key(), _member(tenant, session_id))
    return score is not None and float(score) > 0


def parse_member(member: str) -> tuple[str, str]:
    tenant, _, session_id = member.partition("\t")
    return tenant, session_id


@port
class Leases:
    """Acquires, renews and releases leases for one agent host."""

    def __init__(self, redis: Store, host_id: str, *, ttl: float = 10.0) -> None:
        self.redis = commands(redis)
        self.host_id = host_id
        self.ttl_ms = int(ttl * 1000)
        self.vanished: set[str] = set()
        source = resources.files("broker.store").joinpath("lua", "lease.lua").read_text()
        self._script = commands(redis).register_script(source)

    async def acquire(self, tenant: str, session_id: str) -> Lease:
        """Hold the session; raises :class:`HeldElsewhere` or :class:`SessionMissing`."""
        keys = SessionKeys(tenant, session_id)
        try:
            ok, value = await self._script(
                keys=[keys.lease, keys.snapshot], args=["acquire", self.host_id, self.ttl_ms]
            )
        except ResponseError as exc:
            if no_session(exc):
                raise SessionMissing(session_id) from None
            raise
        if not int(ok):
            raise HeldElsewhere(str(value))
        await self.redis.zadd(leases_key(), {_member(tenant, session_id): self._expiry()})
        return Lease(tenant, session_id, str(value))

    async def renew(
        self, leases: list[tuple[str, str]], fences: Mapping[str, str] | None = None
    ) -> list[tuple[str, str]]:
        """Renew many leases at once; returns those this host no longer holds (lost, or
        given up as archived: :meth:`renew_all` tells which)."""
        renewal = await self.renew_all(leases, fences)
        return [lease for lease in leases if lease in {*renewal.lost, *renewal.archived}]

    async def renew_all(
        self, leases: list[tuple[str, str]], fences: Mapping[str, str] | None = None
    ) -> Renewal:
        """Renew many leases at once, in one round trip. Of the leases lost, the sessions
        the store no longer has at all (Redis came back without its data: no other host
        took them) are in :attr:`vanished` until the next call.

        ``fences`` (session id -> the fencing token this host holds) lets a lease that
        lapsed be taken back when no other host took it meanwhile (see ``lease.lua``)."""
        self.vanished = set()
        if not leases:
            return Renewal([], [])
        results = await self._renew_all(leases, fences or {})
        pairs = list(zip(leases, results, strict=True))
        kept = {_member(t, s): self._expiry() for (t, s), ok in pairs if ok == 1}
        if kept:
            await self.redis.zadd(leases_key(), kept)
        self.vanished = {s for (_, s), ok in pairs if ok == -1}
        return Renewal(
            lost=[lease for lease, ok in pairs if ok in (0, -1)],
            archived=[lease for lease, ok in pairs if ok == 2],
        )

    async def _renew_all(
        self, leases: list[tuple[str, str]], fences: Mapping[str, str]
    ) -> list[int]:
        calls = []
        for tenant, session_id in leases:
            keys = SessionKeys(tenant, session_id)
            fence = fences.get(session_id, "")
            calls.append(([keys.lease, keys.snapshot], ["renew", self.host_id, self.ttl_ms, fence]))
        return [int(r) for r in await call_each(self.redis, self._script, calls)]

    async def release(self, tenant: str, session_id: str, *, hand_over: bool = False) -> None:
        """Give the lease up; ``hand_over`` lists it as expired so another host takes it now."""
        keys = SessionKeys(tenant, session_id)
        await self._script(keys=[keys.lease, keys.snapshot], args=["release", self.host_id, 0])
        if hand_over:
            await self.redis.zadd(leases_key(), {_member(tenant, session_id): 0})
        else:
            await self.redis.zrem(leases_key(), _member(tenant, session_id))

    async def expired(self, limit: int = 100) -> list[tuple[str, str]]:
        """Sessions whose lease ran out (their host died or handed them over)."""
        now = int(time.time() * 1000)
        members = await self.redis.zrangebyscore(leases_key(), "-inf", now, start=0, num=limit)
        return [parse_member(m) for m in members]

    async def forget(self, tenant: str, session_id: str) -> None:
        """Stop tracking a session that needs no host (deleted, or gone)."""
        await self.redis.zrem(leases_key(), _member(tenant, session_id))

    def _expiry(self) -> int:
        return int(time.time() * 1000) + self.ttl_ms
