"""The PostgreSQL archive store (``asyncpg``): one row per session, replaced whole.

The broker creates and migrates its table itself: ``acp_broker_schema`` records the
schema version, and each step of :data:`MIGRATIONS` past it runs once, in a transaction
under an advisory lock, so several processes starting together migrate once.
"""

from __future__ import annotations

import asyncio
from typing import Any

TABLE = "acp_broker_archive"

MIGRATIONS: tuple[str, ...] = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        tenant text NOT NULL,
        session_id text NOT NULL,
        blob bytea NOT NULL,
        archived_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (tenant, session_id)
    )""",
)
"""Schema steps, in order; a deployment's version is how many of them it has applied."""

_LOCK = 0x61637062  # "acpb": one advisory lock key for migrations


class PostgresArchive:
    """An :class:`~.base.ArchiveStore` in a PostgreSQL table (deployments)."""

    def __init__(self, dsn: str, *, pool_size: int = 4) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def _ready(self) -> Any:
        """The connection pool, opened and the schema migrated on first use."""
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    import asyncpg

                    pool = await asyncpg.create_pool(
                        self.dsn, min_size=1, max_size=self.pool_size, timeout=10
                    )
                    await migrate(pool)
                    self._pool = pool
        return self._pool

    async def put(self, tenant: str, session_id: str, blob: bytes) -> None:
        pool = await self._ready()
        await pool.execute(
            f"INSERT INTO {TABLE} (tenant, session_id, blob) VALUES ($1, $2, $3) "
            "ON CONFLICT (tenant, session_id) DO UPDATE "
            "SET blob = EXCLUDED.blob, archived_at = now()",
            tenant,
            session_id,
            blob,
        )

    async def get(self, tenant: str, session_id: str) -> bytes | None:
        pool = await self._ready()
        blob = await pool.fetchval(
            f"SELECT blob FROM {TABLE} WHERE tenant = $1 AND session_id = $2",
            tenant,
            session_id,
        )
        return bytes(blob) if blob is not None else None

    async def delete(self, tenant: str, session_id: str) -> None:
        pool = await self._ready()
        await pool.execute(
            f"DELETE FROM {TABLE} WHERE tenant = $1 AND session_id = $2", tenant, session_id
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


async def migrate(pool: Any) -> int:
    """Apply the schema steps this database lacks; returns its version afterwards."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK)
        await conn.execute("CREATE TABLE IF NOT EXISTS acp_broker_schema (version int NOT NULL)")
        version = await conn.fetchval("SELECT max(version) FROM acp_broker_schema") or 0
        for step in MIGRATIONS[version:]:
            await conn.execute(step)
        if version < len(MIGRATIONS):
            await conn.execute("DELETE FROM acp_broker_schema")
            await conn.execute("INSERT INTO acp_broker_schema VALUES ($1)", len(MIGRATIONS))
        return len(MIGRATIONS)
