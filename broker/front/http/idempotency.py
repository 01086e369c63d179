"""``Idempotency-Key`` for ``POST /v1/sessions``: a retried create returns the first session.

A key is kept in Redis for 24 hours, per tenant (one tenant's key names nothing of
another's), with a fingerprint of the request body: the same key with another body is
refused (``invalid_argument``), not answered with a session made for other inputs.

The first request claims the key (``SET NX``) before it creates anything, with a short lease
(:data:`LEASE_SECONDS`) that it renews while it creates; a retry that comes meanwhile waits
for it (bounded), then gets its session. A front that dies between the claim and the settle
(``kill -9``) leaves a claim that lapses within the lease, and a retry then claims the key
and creates (the session the dead front may have made is not found: it was never named).
The claim is fenced: it holds a token of its own, and the renewal, the settle and the
forget change the key only while it still holds that token, so a request that lost its
claim (stalled past its lease while another took the key) never overwrites the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

from ...errors import ApiError, ErrorCode, invalid_argument
from ...errors.failures import describe
from ...retry import retry, steady, within
from ...store.client import Store
from ...store.errors import StoreError
from ...store.idempotency import IdempotencyRecords

log = logging.getLogger(__name__)

TTL_SECONDS = 24 * 3600
"""How long a settled key names its session."""
LEASE_SECONDS = 10.0
"""How long a claim outlives its front's last renewal (renewed every third of it)."""
HEADER = "idempotency-key"
KEY_MAX = 255
POLL_SECONDS = 0.1
_PENDING = object()
"""What a look at a key another request claimed finds while that request runs."""


def _pending(found: object) -> bool:
    return found is _PENDING


def checked_key(value: str) -> str:
    """An ``Idempotency-Key`` header: 1 to 255 visible ASCII characters."""
    if not 1 <= len(value) <= KEY_MAX or not all(33 <= ord(c) <= 126 for c in value):
        raise invalid_argument(
            f"Idempotency-Key must be 1 to {KEY_MAX} visible ASCII characters (a UUID, say)"
        )
    return value


def fingerprint(body: Any) -> str:
    """What identifies a request body, whatever its keys' order."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """A key this request claimed: the tenant and key, and the pending value only it wrote
    (its fencing token inside)."""

    tenant: str
    key: str
    pending: str
    fp: str


class IdempotencyKeys:
    """Claims, settles and looks up keys."""

    def __init__(self, redis: Store, *, wait: float = 30.0, lease: float = LEASE_SECONDS) -> None:
        self.records = IdempotencyRecords(redis)
        self.wait = wait
        self.lease_ms = int(lease * 1000)

    async def claim(self, tenant: str, key: str, body: Any) -> Claim | str:
        """A :class:`Claim` when this request claimed ``key`` (it creates within
        :meth:`creating`, then :meth:`settle`); else the session id the first request with
        it made (waited for while that request runs, up to ``wait``)."""
        mark = fingerprint(body)
        pending = json.dumps({"fp": mark, "sid": None, "by": secrets.token_hex(8)})
        claim = Claim(tenant, key, pending, mark)
        if await self.records.claim(tenant, key, pending, self.lease_ms):
            return claim

        async def look() -> Claim | str | object:
            raw = await self.records.get(tenant, key)
            if raw is None:  # the first request failed, or died and its claim lapsed
                claimed = await self.records.claim(tenant, key, pending, self.lease_ms)
                return claim if claimed else _PENDING
            stored = json.loads(raw)
            if stored.get("fp") != mark:
                raise invalid_argument(
                    "this Idempotency-Key was used with another request body; use a new key"
                )
            return str(stored["sid"]) if stored.get("sid") else _PENDING

        found = await retry(look, within(steady(POLL_SECONDS), self.wait), again=_pending)
        if found is _PENDING:
            raise ApiError(
                ErrorCode.UNAVAILABLE,
                "the first request with this Idempotency-Key is still running; retry later",
            )
        return cast(Claim | str, found)

    @contextlib.asynccontextmanager
    async def creating(self, claim: Claim) -> AsyncIterator[None]:
        """The block creates the session ``claim`` is for: its lease is renewed meanwhile,
        and a block that fails lets the key go (a retry creates)."""
        renewing = asyncio.ensure_future(self._renew(claim))
        try:
            yield
        except BaseException:
            with contextlib.suppress(StoreError, OSError):  # else it lapses within the lease
                await self.records.forget(claim.tenant, claim.key, claim.pending)
            raise
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing

    async def _renew(self, claim: Claim) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                if not await self.records.renew(
                    claim.tenant, claim.key, claim.pending, self.lease_ms
                ):
                    log.warning("the claim of an Idempotency-Key lapsed while its create ran")
                    return
            except (StoreError, OSError) as exc:  # the next renewal tries again
                log.warning("could not renew an Idempotency-Key's claim: %s", describe(exc))

    async def settle(self, claim: Claim, session_id: str) -> None:
        """The claimed key now names ``session_id``, for :data:`TTL_SECONDS`; unless the claim
        lapsed and another request took the key (logged: this request's client still gets
        its session, retries get the other's)."""
        value = json.dumps({"fp": claim.fp, "sid": session_id})
        if not await self.records.settle(
            claim.tenant, claim.key, claim.pending, value, TTL_SECONDS
        ):
            log.warning(
                "an Idempotency-Key's claim lapsed before session %s was made: the key names "
                "the session of the request that took it over",
                session_id,
            )
