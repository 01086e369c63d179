"""``Idempotency-Key`` for ``POST /v1/sessions``: a retried create returns the first session.

A key is kept in Redis for 24 hours, per tenant (one tenant's key names nothing of
another's), with a fingerprint of the request body: the same key with another body is
refused (``invalid_argument``), not answered with a session made for other inputs. The
first request claims the key (``SET NX``) before it creates anything; a retry that comes
while it runs waits for it (bounded), then gets its session.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast

from ...errors import ApiError, ErrorCode, invalid_argument
from ...retry import retry, steady, within
from ...store.client import Store
from ...store.keys import PREFIX

TTL_SECONDS = 24 * 3600
HEADER = "idempotency-key"
KEY_MAX = 255
POLL_SECONDS = 0.1
_PENDING = object()
"""What a look at a key another request claimed finds while that request runs."""


def _pending(found: object) -> bool:
    return found is _PENDING


def idempotency_key(tenant: str, key: str) -> str:
    """The Redis key of a tenant's ``Idempotency-Key`` (hashed: any text, fixed length)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{PREFIX}:idem:{tenant}:{digest}"


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
        self.redis = redis
        self.wait = wait

    async def claim(self, tenant: str, key: str, body: Any) -> str | None:
        """None when this request claimed ``key`` (it creates, then :meth:`settle` or
        :meth:`forget`); else the session id the first request with it made."""
        name, mark = idempotency_key(tenant, key), fingerprint(body)
        pending = json.dumps({"fp": mark, "sid": None})
        if await self.redis.set(name, pending, nx=True, ex=TTL_SECONDS):
            return None

        async def look() -> object:
            raw = await self.redis.get(name)
            if raw is None:  # the first request failed and let the key go: this one claims it
                claimed = await self.redis.set(name, pending, nx=True, ex=TTL_SECONDS)
                return None if claimed else _PENDING
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
        return cast(str | None, found)

    async def settle(self, tenant: str, key: str, body: Any, session_id: str) -> None:
        """The claimed key now names ``session_id``, for the rest of its 24 hours."""
        value = json.dumps({"fp": fingerprint(body), "sid": session_id})
        await self.redis.set(idempotency_key(tenant, key), value, keepttl=True)

    async def forget(self, tenant: str, key: str) -> None:
        """The claimed key is let go (the create failed): a retry creates."""
        await self.redis.delete(idempotency_key(tenant, key))
