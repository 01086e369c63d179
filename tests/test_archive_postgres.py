"""The PostgreSQL archive store: its table created and migrated by the broker, and an
archived session read and appended to through it exactly as through the directory store.
The tests start their own PostgreSQL server (``initdb`` in a temporary folder)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from broker.store.archive import open_archive
from broker.store.archive.postgres import MIGRATIONS, PostgresArchive, migrate
from broker.store.client import commands
from broker.store.keys import SessionKeys
from broker.store.log import SessionLog
from workers.projector.archiving import Archiver

from .conftest import run_cli
from .support.postgres_server import postgres_available, postgres_server
from .test_archive import TENANT, chunk, make_session

if not postgres_available():
    if os.environ.get("CI"):  # the machines CI runs on have PostgreSQL: a skip would hide it
        pytest.fail("the PostgreSQL archive tests need initdb, which is missing", pytrace=False)
    pytest.skip("initdb is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    with postgres_server() as dsn:
        yield dsn


@pytest.fixture
async def pg_archive(pg_dsn: str) -> AsyncIterator[PostgresArchive]:
    archive = open_archive(pg_dsn)
    assert isinstance(archive, PostgresArchive)
    yield archive
    await archive.close()


async def test_the_table_is_created_and_migrated_once(pg_archive: PostgresArchive) -> None:
    await pg_archive.put("t", "s", b"one")
    await pg_archive.put("t", "s", b"two")  # replaced whole
    assert await pg_archive.get("t", "s") == b"two"
    pool = await pg_archive._ready()
    assert await migrate(pool) == len(MIGRATIONS)  # again: nothing to do
    assert await pool.fetchval("SELECT count(*) FROM acp_broker_schema") == 1
    await pg_archive.delete("t", "s")
    await pg_archive.delete("t", "s")
    assert await pg_archive.get("t", "s") is None


async def test_an_archived_session_through_postgres(
    store: Any, pg_archive: PostgresArchive
) -> None:
    session_log = SessionLog(store, archive=pg_archive)
    session_id, before = await make_session(session_log, 25)
    assert (
        await Archiver(store, pg_archive, session_log=session_log).archive_session(
            TENANT, session_id
        )
        == 26
    )
    assert not await store.exists(SessionKeys(TENANT, session_id).log)
    assert await SessionLog(store, archive=pg_archive).read(TENANT, session_id) == before
    await session_log.append(TENANT, session_id, chunk(26))
    assert [e.seq for e in await session_log.read(TENANT, session_id)] == list(range(1, 28))


async def test_the_archive_command_with_postgres(redis_url: str, pg_dsn: str) -> None:
    from broker.store.client import connect

    store = connect(redis_url)
    archive = PostgresArchive(pg_dsn)
    session_log = SessionLog(store, archive=archive)
    session_id, before = await make_session(session_log, 5)
    common = ["--older-than", "0", "--redis-url", redis_url, "--archive-store", pg_dsn]
    code, out, err = await run_cli("archive", "--dry-run", *common)
    assert code == 0, err
    assert "would archive 1 sessions (6 events)" in out
    assert await commands(store).exists(SessionKeys(TENANT, session_id).log)
    code, out, err = await run_cli("archive", *common)
    assert code == 0, err
    assert "archived 1 sessions (6 events)" in out
    assert not await commands(store).exists(SessionKeys(TENANT, session_id).log)
    assert await SessionLog(store, archive=archive).read(TENANT, session_id) == before
    conn = await asyncpg.connect(pg_dsn)
    assert await conn.fetchval("SELECT count(*) FROM acp_broker_archive") >= 1
    await conn.close()
    await archive.close()
    await store.aclose()
