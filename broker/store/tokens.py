"""The API tokens' records: one text (JSON, no secret) per token id, and the set of ids.
What a record holds and how a token is checked is :mod:`broker.auth.tokens`'s."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .boundary import port
from .client import Store, commands
from .keys import PREFIX


def token_key(token_id: str) -> str:
    """The record of one token."""
    return f"{PREFIX}:token:{token_id}"


TOKENS_KEY = f"{PREFIX}:tokens"
"""Set: every token id."""


@port
class TokenRecords:
    """Store, list and read the API tokens' records."""

    def __init__(self, redis: Store) -> None:
        self.redis = commands(redis)

    async def add(self, token_id: str, record: str) -> None:
        """A new token's record."""
        await self.redis.set(token_key(token_id), record)
        await self.redis.sadd(TOKENS_KEY, token_id)

    async def replace(self, token_id: str, record: str) -> None:
        """A token's record, changed."""
        await self.redis.set(token_key(token_id), record)

    async def ids(self) -> list[str]:
        """Every token's id, sorted."""
        return sorted(str(token_id) for token_id in await self.redis.smembers(TOKENS_KEY))

    async def get(self, token_id: str) -> str | None:
        """A token's record (None: no such token)."""
        record = await self.redis.get(token_key(token_id))
        return None if record is None else str(record)

    async def get_many(self, token_ids: Sequence[str]) -> list[str | None]:
        """The records of ``token_ids``, in order (None for a token there is not)."""
        return list(await asyncio.gather(*(self.get(token_id) for token_id in token_ids)))
