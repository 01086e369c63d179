"""The operation ledger: what each client operation (``operationId``) came to, kept for a while.

A mutation a client may send again (its answer lost with a connection, a deploy, a timeout)
carries an operation id; the ledger keeps one record per operation key: who sent it (tenant,
principal, client instance), under which id. The first request *claims* the key with a
fingerprint of its input (:meth:`OperationLedger.begin`: ``SET NX``), runs, and *settles* it
with its outcome; a retry reads that outcome instead of running again, and a retry with
another input is a conflict. A claim carries a lease (a wall-clock deadline): a claim whose
request died without settling it lapses, and the caller decides what a lapsed claim means
for its operation (run it again when that is safe, else say the outcome is unknown).

Records live :data:`RETENTION_SECONDS` from their claim; after that an id is unknown again.
This module is the store's side only: no protocol here (see :mod:`broker.protocol.operations`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from ..model.events import JsonObject
from .boundary import port
from .client import Store, commands
from .keys import PREFIX

RETENTION_SECONDS: Final = 24 * 3600
"""How long an operation's outcome is kept (and a retry answered with it): a day."""
POLL_SECONDS: Final = 0.1
"""How often a retry looks whether the request that claimed its key has settled it."""

_SWAP: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[2] == '' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  end
  return 1
end
return 0
"""
"""Replace (or, given ``''``, delete) a record only if it is still the one read: a lapsed
claim two retries take over at the same moment goes to one of them, and a request lets go
only of its own claim."""


class Claim(StrEnum):
    """What :meth:`OperationLedger.begin` found."""

    NEW = "new"  # this request claimed the key: run it, then settle or let go
    PENDING = "pending"  # another request claimed it and has not settled it
    DONE = "done"  # settled: ``outcome`` is what the first request came to
    CONFLICT = "conflict"  # the key was claimed with another input


@dataclass(frozen=True, slots=True)
class OperationKey:
    """Who sent an operation and its id: one ledger record each."""

    tenant: str
    principal: str
    client: str
    """The client instance (``""``: the client named none; the principal's records then)."""
    operation_id: str

    @property
    def name(self) -> str:
        """The Redis key (hashed: any id, fixed length; the tenant's records together)."""
        ident = "\0".join((self.principal, self.client, self.operation_id))
        return f"{PREFIX}:op:{self.tenant}:{hashlib.sha256(ident.encode()).hexdigest()}"

    @property
    def digest(self) -> str:
        """A short name of the key that nothing outside it can be guessed from (the name
        of a prompt made under it, say)."""
        return hashlib.sha256(self.name.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Entry:
    """A ledger record as :meth:`OperationLedger.begin` found or made it."""

    claim: Claim
    outcome: JsonObject | None = None
    """``DONE``: the outcome the first request settled (JSON, as the caller gave it)."""
    lapsed: bool = False
    """``PENDING``: the claim's lease ran out (its request died, or gave it up)."""
    raw: str = ""
    """The record as read (what :meth:`OperationLedger.take_over` compares against)."""


@port
class OperationLedger:
    """Claims, settles and reads operation records (one Redis string each)."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)

    async def begin(self, key: OperationKey, fingerprint: str, lease: float) -> Entry:
        """Claim ``key`` for ``lease`` seconds (:attr:`Claim.NEW`), or say what holds it."""
        mine = _pending(fingerprint, lease)
        if await self.redis.set(key.name, mine, nx=True, ex=RETENTION_SECONDS):
            return Entry(Claim.NEW, raw=mine)
        entry = await self.read(key, fingerprint)
        if entry is None:  # settled and expired, or let go, between the two commands
            return await self.begin(key, fingerprint, lease)
        return entry

    async def decide(
        self,
        key: OperationKey,
        fingerprint: str,
        lease: float,
        *,
        repeatable: bool,
        wait: float,
    ) -> Entry:
        """:meth:`begin`, then past another request's claim: wait up to ``wait`` seconds
        while its lease holds, and take a lapsed claim over when the operation is
        ``repeatable``. The entry is ``NEW`` (run it), ``DONE``, ``CONFLICT``, or
        ``PENDING``: lapsed (not repeatable: its outcome is unknown) or still running
        after ``wait``."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait
        entry = await self.begin(key, fingerprint, lease)
        while entry.claim is Claim.PENDING:
            if entry.lapsed:
                if not repeatable:
                    return entry
                taken = await self.take_over(key, entry, lease)
                entry = taken or await self.begin(key, fingerprint, lease)
                continue
            if loop.time() >= give_up:
                return entry
            await asyncio.sleep(POLL_SECONDS)
            entry = await self.begin(key, fingerprint, lease)
        return entry

    async def read(self, key: OperationKey, fingerprint: str) -> Entry | None:
        """The record of ``key`` as seen by a request with ``fingerprint`` (None: none)."""
        raw = await self.redis.get(key.name)
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        record = json.loads(text)
        if record.get("fp") != fingerprint:
            return Entry(Claim.CONFLICT, raw=text)
        if record.get("state") == "done":
            return Entry(Claim.DONE, outcome=record.get("outcome"), raw=text)
        lapsed = float(record.get("until") or 0) <= time.time()
        return Entry(Claim.PENDING, lapsed=lapsed, raw=text)

    async def take_over(self, key: OperationKey, entry: Entry, lease: float) -> Entry | None:
        """Claim a lapsed ``entry`` of ``key`` for this request (None: another took it, or
        it changed meanwhile)."""
        fingerprint = json.loads(entry.raw)["fp"]
        mine = _pending(fingerprint, lease)
        if await self._swap(key, entry, mine):
            return Entry(Claim.NEW, raw=mine)
        return None

    async def settle(self, key: OperationKey, fingerprint: str, outcome: JsonObject) -> None:
        """``key`` came to ``outcome`` (JSON): every retry gets it, for the record's life."""
        record = {"fp": fingerprint, "state": "done", "outcome": outcome}
        text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        await self.redis.set(key.name, text, keepttl=True)

    async def lapse(self, key: OperationKey, entry: Entry) -> None:
        """End this request's claim now, unsettled (its outcome is not known here): a
        retry decides at once rather than after the lease."""
        fingerprint = json.loads(entry.raw)["fp"]
        await self._swap(key, entry, _pending(fingerprint, 0))

    async def forget(self, key: OperationKey, entry: Entry) -> None:
        """Let this request's claim go (nothing was done): a retry runs as a first request."""
        await self._swap(key, entry, "")

    async def _swap(self, key: OperationKey, entry: Entry, new: str) -> bool:
        return bool(await self.redis.eval(_SWAP, 1, key.name, entry.raw, new))


def _pending(fingerprint: str, lease: float) -> str:
    record = {"fp": fingerprint, "state": "pending", "until": round(time.time() + lease, 3)}
    return json.dumps(record, separators=(",", ":"))
