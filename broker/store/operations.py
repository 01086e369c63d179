"""The operation ledger: what each client operation (``operationId``) came to, kept for a while.

A mutation a client may send again (its answer lost with a connection, a deploy, a timeout)
carries an operation id; the ledger keeps one record per operation key: who sent it (tenant,
principal, client instance), under which id. The first request *claims* the key with a
fingerprint of its input (:meth:`OperationLedger.begin`: ``SET NX``), runs, and *settles* it
with its outcome; a retry reads that outcome instead of running again, and a retry with
another input is a conflict. A claim carries a lease (a wall-clock deadline) its request
renews while it runs: a claim whose request died without settling it lapses, and the caller
decides what a lapsed claim means for its operation (run it again when that is safe, else
say the outcome is unknown). A claim is fenced: it holds a token of its own, and a renewal,
a held settle or a release changes the record only while it is still that claim, so a
request that stalled past its lease while a retry took the key over never overwrites it.

Records live a retention window (:data:`RETENTION_SECONDS` unless the ledger is given
another) from their claim. Past it, a small tombstone (a key per id, no outcome) remembers
for a further period (:data:`TOMBSTONE_SECONDS`) that the id was used: a retry then finds
:attr:`Claim.FORGOTTEN` (its outcome is no longer known) rather than running again; after
that, an id is unknown again.
This module is the store's side only: no protocol here (see :mod:`broker.protocol.operations`;
the fronts' one use of it is :mod:`broker.front.operation_claims`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
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
TOMBSTONE_SECONDS: Final = 7 * 24 * 3600
"""How long past the retention a used id is still known as used: a week."""
POLL_SECONDS: Final = 0.1
"""How often a retry looks whether the request that claimed its key has settled it."""

_BEGIN: Final = """
local found = redis.call('GET', KEYS[1])
if found then return found end
if redis.call('EXISTS', KEYS[2]) == 1 then return '' end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[2], '1', 'PX', ARGV[3]) end
return false
"""
"""Claim a key (nil), or the record that holds it, or ``''``: only its tombstone is left."""
_SWAP: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[2] == '' then
    redis.call('DEL', KEYS[1], KEYS[2])
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
    FORGOTTEN = "forgotten"  # used before the retention window: its outcome is not known


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
        """The Redis key (hashed: any id, fixed length; the tenant's records together; the
        hash a cluster slot tag, shared with the :attr:`tombstone`)."""
        return f"{PREFIX}:op:{self.tenant}:{{{self._hash}}}"

    @property
    def tombstone(self) -> str:
        """The key that outlives the record, saying the id was used."""
        return f"{PREFIX}:optomb:{self.tenant}:{{{self._hash}}}"

    @property
    def _hash(self) -> str:
        ident = "\0".join((self.principal, self.client, self.operation_id))
        return hashlib.sha256(ident.encode()).hexdigest()

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

    def __init__(
        self,
        redis: Store,
        *,
        retention: float = RETENTION_SECONDS,
        tombstone: float = TOMBSTONE_SECONDS,
    ) -> None:
        self.redis = commands(redis)
        self.retention_ms = max(1, round(retention * 1000))
        self.tombstone_ms = round(tombstone * 1000)

    async def begin(self, key: OperationKey, fingerprint: str, lease: float) -> Entry:
        """Claim ``key`` for ``lease`` seconds (:attr:`Claim.NEW`), or say what holds it."""
        mine = _pending(fingerprint, lease)
        kept = self.retention_ms + self.tombstone_ms if self.tombstone_ms else 0
        found = await self.redis.eval(
            _BEGIN, 2, key.name, key.tombstone, mine, self.retention_ms, kept
        )
        if found is None:
            return Entry(Claim.NEW, raw=mine)
        text = found.decode() if isinstance(found, bytes) else str(found)
        if text == "":
            return Entry(Claim.FORGOTTEN)
        return self._entry(text, fingerprint)

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
        return self._entry(raw.decode() if isinstance(raw, bytes) else str(raw), fingerprint)

    def _entry(self, text: str, fingerprint: str) -> Entry:
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

    async def renew(self, key: OperationKey, entry: Entry, lease: float) -> Entry | None:
        """Extend this request's claim ``entry`` to ``lease`` seconds from now (None: it is
        no longer this request's: lapsed and taken over, or ended)."""
        record = json.loads(entry.raw)
        mine = _pending(record["fp"], lease, record.get("by"))
        return Entry(Claim.NEW, raw=mine) if await self._swap(key, entry, mine) else None

    async def settle(
        self, key: OperationKey, fingerprint: str, outcome: JsonObject, held: Entry | None = None
    ) -> bool:
        """``key`` came to ``outcome`` (JSON): every retry gets it, for the record's life.
        ``held``: only while the record is still this claim (fenced); whether it was written."""
        record = {"fp": fingerprint, "state": "done", "outcome": outcome}
        text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        if held is not None:
            return await self._swap(key, held, text)
        await self.redis.set(key.name, text, keepttl=True)
        return True

    async def lapse(self, key: OperationKey, entry: Entry) -> None:
        """End this request's claim now, unsettled (its outcome is not known here): a
        retry decides at once rather than after the lease."""
        record = json.loads(entry.raw)
        # A second in the past: past by any reader's clock (a deadline of now, rounded to
        # the millisecond, could read as a moment ahead).
        await self._swap(key, entry, _pending(record["fp"], -1, record.get("by")))

    async def forget(self, key: OperationKey, entry: Entry) -> None:
        """Let this request's claim go (nothing was done): a retry runs as a first request."""
        await self._swap(key, entry, "")

    async def _swap(self, key: OperationKey, entry: Entry, new: str) -> bool:
        return bool(await self.redis.eval(_SWAP, 2, key.name, key.tombstone, entry.raw, new))


def _pending(fingerprint: str, lease: float, token: str | None = None) -> str:
    """A claim's record: its fencing token (the claim's own, kept by its renewals) makes it
    differ from any other claim's, and its version from any other write of the same claim
    (a renewal in the same millisecond would otherwise read as the claim it replaced, which
    a stale holder could then swap), whatever the clock."""
    record = {
        "fp": fingerprint,
        "state": "pending",
        "until": round(time.time() + lease, 3),
        "by": token or secrets.token_hex(8),
        "v": secrets.token_hex(4),
    }
    return json.dumps(record, separators=(",", ":"))
