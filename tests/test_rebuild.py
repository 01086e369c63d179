"""The session index rebuilt from the logs alone equals the one the broker kept live.

Sessions are made through a broker (the ``broker`` fixture: real Redis and the embedded
store): several cwds, one titled by its first prompt, one deleted, one named and tagged with
``session/set_title``. Once the projector has caught up, the live index is dumped; then the
index is wiped or damaged and ``rebuild_index`` (and, on real Redis, the
``acp-broker rebuild-index`` command) must bring back exactly the same thing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from broker.serve import Broker
from broker.store.client import commands
from broker.store.index import (
    ACP_LISTING,
    SessionIndex,
    Version,
    cwd_listing,
    decode_row,
    encode_row,
    member,
)
from broker.store.keys import TenantKeys
from broker.store.log import SessionLog
from broker.store.rebuild import rebuild_index

from .conftest import run_cli
from .support.client import LOADED_WAIT, AcpTestClient, acp_client, wait_for
from .support.projection import feeds_of, until_consumed

TENANT = "default"
TIMEOUT = LOADED_WAIT * 2
"""A bound, not an estimate: each test here starts a broker or the CLI (a Python process of
its own, seconds on a loaded machine) and waits on conditions."""
INDEX_PATTERN = "acpb:{t:default}:*"


async def _make_sessions(client: AcpTestClient) -> dict[str, str]:
    """Sessions in every state the index knows; returns them by role."""
    made = {
        "plain": await client.new(cwd="/work/alpha"),
        "titled": await client.new(cwd="/work/alpha"),
        "other_cwd": await client.new(cwd="/work/beta/"),
        "deleted": await client.new(cwd="/work/beta"),
        "named": await client.new(cwd="/work/gamma"),
    }
    # The demo agent announces its commands right after answering session/new. The prompt
    # below is answered on the same agent stdout after those announcements, so once it is
    # done every announcement has been handled and nothing changes a session after the dump.
    await client.prompt(made["titled"], "/notool a title from the prompt")
    await client.request("session/delete", {"sessionId": made["deleted"]})
    await client.request(
        "session/set_title",
        {"sessionId": made["named"], "title": "named by hand", "_meta": {"test/tag": ["x", 1]}},
    )
    return made


async def _caught_up(redis: Any, made: dict[str, str]) -> dict[str, Any]:
    """Wait (bounded) until every session's index version is its snapshot's seq and the
    projector has nothing of theirs in flight: a batch the front's own projections overtook
    retries its writes, and one landing after the wipe below would put a row back."""
    session_log = SessionLog(redis)
    keys = TenantKeys(TENANT)

    async def indexed() -> bool:
        versions = await redis.hgetall(keys.versions)
        seqs = {sid: (await session_log.snapshot(TENANT, sid)).seq for sid in made.values()}
        return seqs == {
            sid: Version.decode(versions[sid]).seq  # type: ignore[union-attr]
            for sid in made.values()
            if sid in versions
        }

    await wait_for(indexed, what="every session's index version at its snapshot's seq")
    await until_consumed(redis, feeds_of(TENANT, made.values()))
    rows = await redis.hgetall(keys.rows)
    named = decode_row(rows[made["named"]])
    titled = decode_row(rows[made["titled"]])
    deleted = decode_row(rows[made["deleted"]])
    assert named["title"] == "named by hand"
    assert named["_meta"] == {"test/tag": ["x", 1]}
    assert titled["title"] == "/notool a title from the prompt"
    assert deleted["status"] == "DELETED"
    return dict(await SessionIndex(redis).dump(TENANT))


async def _live_index(broker: Broker, url: str) -> tuple[dict[str, str], dict[str, Any]]:
    client = await acp_client(url)
    try:
        made = await _make_sessions(client)
        live = await _caught_up(broker.redis, made)
    finally:
        await client.close()
    # Sanity: the dump is what a client sees.
    rows = live["rows"]
    assert set(rows) == set(made.values())
    listed = live["listings"][ACP_LISTING]
    assert len(listed) == 4 and not any(m.endswith(made["deleted"]) for m in listed)
    assert len(live["listings"][cwd_listing("/work/alpha")]) == 2
    assert len(live["listings"][cwd_listing("/work/beta")]) == 1
    return made, live


async def _wipe_index(redis: Any) -> int:
    keys = [key async for key in redis.scan_iter(match=INDEX_PATTERN, count=1000)]
    assert keys, "no index keys found to wipe"
    await redis.delete(*keys)
    assert await SessionIndex(redis).dump(TENANT) == {"rows": {}, "listings": {}}
    return len(keys)


async def test_rebuild_from_nothing_equals_the_live_index(broker: Broker, url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        made, live = await _live_index(broker, url)
        await _wipe_index(broker.redis)
        counts = await rebuild_index(broker.redis)
        assert counts == {TENANT: len(made)}
        assert await SessionIndex(broker.redis).dump(TENANT) == live

        # The rebuilt index serves session/list exactly as before.
        client = await acp_client(url)
        listed = await client.conn.list_sessions()
        assert {s.session_id for s in listed.sessions} == set(made.values()) - {made["deleted"]}
        [named] = [s for s in listed.sessions if s.session_id == made["named"]]
        assert named.title == "named by hand"
        assert named.field_meta == {
            "test/tag": ["x", 1],
            "acpBroker/agent": "demo",
            "acpBroker/status": "RUNNING",
        }
        await client.close()


async def test_rebuild_repairs_damaged_rows(broker: Broker, url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        made, live = await _live_index(broker, url)
        redis = broker.redis
        keys = TenantKeys(TENANT)
        # A row with the wrong content, a row that is not JSON, a row gone missing.
        wrong = {**decode_row(live["rows"][made["titled"]]), "title": "not the real title"}
        await commands(redis).hset(keys.rows, made["titled"], encode_row(wrong))
        await commands(redis).hset(keys.rows, made["plain"], "{{ not json")
        await commands(redis).hdel(keys.rows, made["other_cwd"])
        # A stray row (with its version and listing entry) for a session that does not exist.
        ghost = "sess_" + "0" * 32
        ghost_row = {**decode_row(live["rows"][made["plain"]]), "sessionId": ghost}
        ghost_member = member(1_000, ghost)
        await commands(redis).hset(keys.rows, ghost, encode_row(ghost_row))
        ghost_version = json.dumps({"q": 3, "e": {ACP_LISTING: ghost_member}})
        await commands(redis).hset(keys.versions, ghost, ghost_version)
        await commands(redis).zadd(keys.index(ACP_LISTING), {ghost_member: 0})
        assert await SessionIndex(redis).dump(TENANT) != live

        counts = await rebuild_index(redis)
        assert counts == {TENANT: len(made)}
        assert await SessionIndex(redis).dump(TENANT) == live


async def test_rebuild_removes_stray_listing_entries(broker: Broker, url: str) -> None:
    """Listing entries the logs do not account for go too: a ghost's entry without a row, a
    stale entry of a live session (an old position), an entry of a deleted session."""
    async with asyncio.timeout(TIMEOUT):
        made, live = await _live_index(broker, url)
        redis = broker.redis
        keys = TenantKeys(TENANT)
        ghost = "sess_" + "f" * 32
        await commands(redis).zadd(keys.index(ACP_LISTING), {member(2_000, ghost): 0})
        await commands(redis).zadd(keys.index(ACP_LISTING), {member(3_000, made["plain"]): 0})
        await commands(redis).zadd(
            keys.index(cwd_listing("/work/beta")), {member(4_000, made["deleted"]): 0}
        )

        client = await acp_client(url)
        damaged = await client.conn.list_sessions()
        await client.close()
        assert len(damaged.sessions) == 5  # "plain" twice

        await rebuild_index(redis)
        assert await SessionIndex(redis).dump(TENANT) == live
        client = await acp_client(url)
        listed = await client.conn.list_sessions()
        await client.close()
        ids = [s.session_id for s in listed.sessions]
        assert sorted(ids) == sorted(set(made.values()) - {made["deleted"]})


async def test_rebuild_survives_a_corrupt_version_entry(broker: Broker, url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        made, live = await _live_index(broker, url)
        keys = TenantKeys(TENANT)
        await commands(broker.redis).hset(keys.versions, made["named"], "garbage")
        await rebuild_index(broker.redis)
        assert await SessionIndex(broker.redis).dump(TENANT) == live


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_rebuild_index_command(broker: Broker, url: str, redis_url: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        made, live = await _live_index(broker, url)
        await _wipe_index(broker.redis)
        # One more damage for the command to repair: a stray row of a session with no log.
        await commands(broker.redis).hset(TenantKeys(TENANT).rows, "sess_ghost", "{}")

        code, out, err = await run_cli("rebuild-index", "--redis-url", redis_url)
        assert code == 0, err
        assert out.splitlines() == [f"{TENANT}: {len(made)} sessions re-indexed"]
        assert await SessionIndex(broker.redis).dump(TENANT) == live

        # Run again on an intact index: nothing changes.
        code, _, err = await run_cli("rebuild-index", "--redis-url", redis_url)
        assert code == 0, err
        assert await SessionIndex(broker.redis).dump(TENANT) == live
