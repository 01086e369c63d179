"""``Idempotency-Key`` for ``POST /v1/sessions``: a retried create returns the first session.

A key is kept in Redis for 24 hours, per tenant (one tenant's key names nothing of
another's), with a fingerprint of the request body: the same key with another body is
refused (``invalid_argument``), not answered with a session made for other inputs. The
first request claims the key (``SET NX``) before it creates anything; a retry that comes
while it runs waits for it (bounded), then gets its session.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from ...errors import ApiError, ErrorCode, invalid_argument
from ...store.client import Store
from ...store.idempotency import IdempotencyRecords

TTL_SECONDS = 24 * 3600
HEADER = "idempotency-key"
KEY_MAX = 255
POLL_SECONDS = 0.1


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


class IdempotencyKeys:
    """Claims, settles and looks up keys."""

    def __init__(self, redis: Store, *, wait: float = 30.0) -> None:
        self.records = IdempotencyRecords(redis)
        self.wait = wait

    async def claim(self, tenant: str, key: str, body: Any) -> str | None:
        """None when this request claimed ``key`` (it creates, then :meth:`settle` or
        :meth:`forget`); else the session id the first request with it made."""
        mark = fingerprint(body)
        pending = json.dumps({"fp": mark, "sid": None})
        if await self.records.claim(tenant, key, pending, TTL_SECONDS):
            return None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.wait
        while True:
            raw = await self.records.get(tenant, key)
            if raw is None:  # the first request failed and let the key go: this one claims it
                if await self.records.claim(tenant, key, pending, TTL_SECONDS):
                    return None
                continue
            stored = json.loads(raw)
            if stored.get("fp") != mark:
                raise invalid_argument(
                    "this Idempotency-Key was used with another request body; use a new key"
                )
            if stored.get("sid"):
                return str(stored["sid"])
            if loop.time() > give_up:
                raise ApiError(
                    ErrorCode.UNAVAILABLE,
                    "the first request with this Idempotency-Key is still running; retry later",
                )
            await asyncio.sleep(POLL_SECONDS)

    async def settle(self, tenant: str, key: str, body: Any, session_id: str) -> None:
        """The claimed key now names ``session_id``, for the rest of its 24 hours."""
        value = json.dumps({"fp": fingerprint(body), "sid": session_id})
        await self.records.settle(tenant, key, value)

    async def forget(self, tenant: str, key: str) -> None:
        """The claimed key is let go (the create failed): a retry creates."""
        await self.records.forget(tenant, key)
