"""The store's ports keep their contracts on every topology: the embedded store, one Redis
server, a Redis Cluster and the master of a Sentinel set. Each port is driven as its role
drives it, and read back through the port itself."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.model.events import EventType
from broker.store import hosts, operations
from broker.store.bus import CommandBus, CommandMarks
from broker.store.client import commands
from broker.store.errors import StoreError, StoreReplyError, group_missing
from broker.store.feeds import ChangeFeeds
from broker.store.index import ACP_LISTING, SessionIndex
from broker.store.keys import INDEX_CHANNEL, SessionKeys, host_inbox
from broker.store.leases import HeldElsewhere, Leases
from broker.store.live import LiveFeed, Message, Publisher, open_live_feed
from broker.store.log import SessionLog, SessionMissing
from broker.store.names import new_session_id
from broker.store.operations import Claim, OperationKey, OperationLedger
from broker.store.presence import PresenceStore, presence_key
from broker.store.quotas import RateCounters, TenantFull, check_session_quota
from broker.store.retention import RetentionSets
from broker.store.tokens import TokenRecords

TIMEOUT = 15.0
TENANT = "acme"


@pytest.fixture(params=["embedded", "redis", "cluster", "sentinel"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _session(log: SessionLog, **created: Any) -> str:
    session_id = new_session_id()
    body = {"type": EventType.CREATED, "cwd": "/w", "agent": "demo", **created}
    await log.create(TENANT, session_id, body)
    return session_id


async def _heard(feed: LiveFeed, until: Any) -> list[Message]:
    got: list[Message] = []
    async with asyncio.timeout(TIMEOUT):
        while not until(got):
            got += await feed.read_batch()
    return got


# -- the session log: append, read, replay -----------------------------------------------------


async def test_the_log_appends_reads_and_replays(store: Any) -> None:
    log = SessionLog(store)
    try:
        session_id = await _session(log)
        update = {"type": EventType.UPDATE, "update": {"sessionUpdate": "agent_message_chunk"}}
        positions = [await log.append(TENANT, session_id, update) for _ in range(3)]
        assert [p.seq for p in positions] == [2, 3, 4]
        events = await log.read(TENANT, session_id)
        assert [e.seq for e in events] == [1, 2, 3, 4]
        assert events[0].type == EventType.CREATED
        replayed = await log.read(TENANT, session_id, after=2)
        assert [e.seq for e in replayed] == [3, 4]
        assert await log.head(TENANT, session_id) == (4, positions[0].epoch)
        assert await log.heads([(TENANT, session_id), (TENANT, "sess_none")]) == [4, None]
        snapshot = await log.snapshot(TENANT, session_id)
        assert (snapshot.seq, snapshot.cwd) == (4, "/w")
        with pytest.raises(SessionMissing):
            await log.head(TENANT, "sess_none")
    finally:
        log.close()


# -- the index: project, page, watch -----------------------------------------------------------


async def test_the_index_projects_pages_and_announces(store: Any) -> None:
    log, index = SessionLog(store), SessionIndex(store)
    watch = open_live_feed(store)
    try:
        await watch.ssubscribe(INDEX_CHANNEL)
        await _heard(watch, lambda got: any(m["type"] == "ssubscribe" for m in got))
        made = [await _session(log, title=f"s{i}") for i in range(3)]
        for session_id in made:
            assert await index.project(await log.snapshot(TENANT, session_id))
        page = await index.page(TENANT, ACP_LISTING, None, 2)
        assert page.has_more and len(page.sessions()) == 2
        rest = await index.page(TENANT, ACP_LISTING, page.last, 2)
        listed = [s["sessionId"] for s in page.sessions() + rest.sessions()]
        assert sorted(listed) == sorted(made) and not rest.has_more
        heard = await _heard(watch, lambda got: any(m["type"] == "smessage" for m in got))
        assert TENANT in {m["data"] for m in heard if m["type"] == "smessage"}
        await check_session_quota(store, TENANT, 4)
        with pytest.raises(TenantFull):
            await check_session_quota(store, TENANT, 3)
    finally:
        await watch.aclose()
        index.close()
        log.close()


# -- the live feed ------------------------------------------------------------------------------


async def test_the_live_feed_hears_what_is_published(store: Any) -> None:
    feed, publisher = open_live_feed(store), Publisher(store)
    try:
        assert await publisher.publish("{ports}:nobody", "x") == 0
        await feed.ssubscribe("{ports}:live")
        await _heard(feed, lambda got: any(m["type"] == "ssubscribe" for m in got))
        assert await publisher.publish("{ports}:live", "hello") == 1
        heard = await _heard(feed, lambda got: any(m["type"] == "smessage" for m in got))
        assert [m["data"] for m in heard if m["type"] == "smessage"] == ["hello"]
    finally:
        await feed.aclose()


# -- the command bus: queue, inbox, replies, taken marks ---------------------------------------


async def test_the_queue_delivers_to_its_group_once_and_trims_behind_it(store: Any) -> None:
    bus = CommandBus(store)
    await bus.send("acpb:hosts:queue", "before any host")  # stale to a group made at "$"
    with pytest.raises(StoreError) as missing:
        await bus.read_queue("hosts", "h1", count=10, block_ms=10)
    assert group_missing(missing.value)
    assert isinstance(missing.value, StoreReplyError)  # the store's own class, not the client's
    await bus.create_queue_group("hosts", "$")
    await bus.create_queue_group("hosts", "$")  # made already: nothing
    sent = [await bus.send("acpb:hosts:queue", f"c{i}") for i in range(3)]
    got = await bus.read_queue("hosts", "h1", count=10, block_ms=100)
    assert [(entry_id, fields["m"]) for entry_id, fields in got] == [
        (entry_id, f"c{i}") for i, entry_id in enumerate(sent)
    ]
    assert await bus.read_queue("hosts", "h2", count=10, block_ms=10) == []
    assert await bus.ack_stale("hosts", horizon=3600) == 0  # none pending that long
    assert await bus.trim_queue("hosts") == 0  # delivered, not acknowledged: kept
    await bus.ack_queued("hosts", [entry_id for entry_id, _ in got])
    assert await bus.trim_queue("hosts") == 4  # the stale one with them
    await bus.send("acpb:hosts:queue", "late")
    await bus.read_queue("hosts", "h1", count=10, block_ms=100)
    assert await bus.ack_stale("hosts", horizon=-60) == 1  # its acknowledgement "failed"


async def test_an_inbox_is_read_in_order_and_trimmed_up_to_what_was_read(store: Any) -> None:
    bus, inbox = CommandBus(store), host_inbox("h1")
    assert await bus.read_inbox(inbox, "0", count=10, block_ms=10) == []
    sent = [await bus.send(inbox, f"c{i}") for i in range(4)]
    first = await bus.read_inbox(inbox, "0", count=2, block_ms=10)
    assert [fields["m"] for _, fields in first] == ["c0", "c1"]
    rest = await bus.read_inbox(inbox, first[-1][0], count=10, block_ms=10)
    assert [entry_id for entry_id, _ in rest] == sent[2:]
    assert await bus.trim_inbox(inbox, None, 60_000) == 0
    assert await bus.trim_inbox(inbox, sent[-1], 60_000) == 4


async def test_a_mark_is_claimed_once_kept_and_cleared(store: Any) -> None:
    marks = CommandMarks(store)
    assert await marks.claim("r1", "run:h1", 60_000)
    assert not await marks.claim("r1", "run:h2", 60_000)
    assert await marks.get("r1") == "run:h1"
    await marks.extend("r1", 60_000)
    await marks.put("r1", "done:{}", 60_000)
    assert await marks.get("r1") == "done:{}"
    await marks.clear("r1")
    assert await marks.get("r1") is None
    assert await marks.claim("r1", "run:h2", 60_000)


# -- leases and the host registry --------------------------------------------------------------


async def test_leases_fence_one_host_at_a_time(store: Any) -> None:
    log = SessionLog(store)
    one, two = Leases(store, "h1", ttl=10.0), Leases(store, "h2", ttl=10.0)
    try:
        session_id = await _session(log)
        with pytest.raises(SessionMissing):
            await one.acquire(TENANT, "sess_none")
        lease = await one.acquire(TENANT, session_id)
        assert await hosts.lease_holder(store, TENANT, session_id) == "h1"
        with pytest.raises(HeldElsewhere):
            await two.acquire(TENANT, session_id)
        assert await one.renew([(TENANT, session_id)], {session_id: lease.fence}) == []
        assert await two.renew([(TENANT, session_id)]) == [(TENANT, session_id)]
        await one.release(TENANT, session_id, hand_over=True)
        assert await two.expired() == [(TENANT, session_id)]
        taken = await two.acquire(TENANT, session_id)
        assert int(taken.fence) > int(lease.fence)
        await two.forget(TENANT, session_id)
        assert await two.expired() == []
    finally:
        log.close()


async def test_the_host_registry_says_who_is_alive_and_what_agents_can(store: Any) -> None:
    assert not await hosts.any_alive(store)
    await hosts.announce(store, "h1", ttl=10.0)
    assert await hosts.any_alive(store)
    await hosts.withdraw(store, "h1")
    assert not await hosts.any_alive(store)
    await hosts.publish_capabilities(store, "demo", '{"loadSession": true}')
    assert await hosts.capabilities(store) == {"demo": '{"loadSession": true}'}
    assert await hosts.lease_holder(store, TENANT, "sess_none") is None


# -- idempotency keys, rate counters, tokens ---------------------------------------------------


async def test_an_operation_record_is_claimed_once_fenced_settled_and_forgotten(
    store: Any,
) -> None:
    ledger = OperationLedger(store)
    key = OperationKey(TENANT, "", "rest", "k")
    mine = await ledger.begin(key, "fp", 60)
    assert mine.claim is Claim.NEW
    assert (await ledger.begin(key, "fp", 60)).claim is Claim.PENDING
    other = await ledger.begin(OperationKey("other", "", "rest", "k"), "fp", 60)
    assert other.claim is Claim.NEW  # tenants apart
    renewed = await ledger.renew(key, mine, 60)
    assert renewed is not None
    assert await ledger.renew(key, mine, 60) is None  # a stale claim is not this one
    assert not await ledger.settle(key, "fp", {"result": 2}, held=mine)
    assert await ledger.settle(key, "fp", {"result": 1}, held=renewed)
    assert (await ledger.begin(key, "fp", 60)).outcome == {"result": 1}
    await ledger.forget(key, renewed)  # settled: no claim to forget
    assert (await ledger.begin(key, "fp", 60)).claim is Claim.DONE
    gone = OperationKey(TENANT, "", "rest", "gone")
    await ledger.forget(gone, await ledger.begin(gone, "fp", 60))
    assert await ledger.read(gone, "fp") is None


async def test_a_claim_renewed_in_the_same_millisecond_still_fences_its_old_holder(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operations.time, "time", lambda: 1_800_000_000.0)  # a frozen clock
    ledger = OperationLedger(store)
    key = OperationKey(TENANT, "", "rest", "same-ms")
    mine = await ledger.begin(key, "fp", 60)
    renewed = await ledger.renew(key, mine, 60)
    assert renewed is not None and renewed.raw != mine.raw
    assert await ledger.renew(key, mine, 60) is None
    assert not await ledger.settle(key, "fp", {"result": 2}, held=mine)


async def test_presence_entries_are_put_refreshed_lapse_and_leave(store: Any) -> None:
    lasting, lapsing = PresenceStore(store, 60.0), PresenceStore(store, 0.001)
    first = await lasting.put(TENANT, "sess_p", {"attachment_a": {"state": "online"}})
    second = await lapsing.put(TENANT, "sess_p", {"attachment_b": {"state": "online"}})
    assert second == first + 1
    await lasting.refresh(TENANT, "sess_p", {"attachment_a": {"state": "away"}})
    await asyncio.sleep(0.01)  # past attachment_b's 1 ms: the lapse under test
    read = await lasting.read(TENANT, "sess_p")
    assert read.entries == {"attachment_a": {"state": "away"}} and read.revision == second
    assert read.expired == {"attachment_b": {"state": "online"}}
    assert await lasting.remove(TENANT, "sess_p", "attachment_b") == second + 1
    assert await lasting.remove(TENANT, "sess_p", "attachment_b") is None  # once
    assert await lasting.remove(TENANT, "sess_p", "attachment_a") == second + 2
    # The last one out took the hash: nothing stays; a new one counts on past the old.
    assert not await commands(store).exists(presence_key(TENANT, "sess_p"))
    assert await lasting.put(TENANT, "sess_p", {"attachment_c": {}}) > second + 2


async def test_rate_counters_add_up_across_callers(store: Any) -> None:
    counters = RateCounters(store)
    assert await counters.add("acpb:rate:{t}:1", 5, 5) == 5
    assert await RateCounters(store).add("acpb:rate:{t}:1", 3, 5) == 8
    assert await counters.add("acpb:rate:{t}:2", 1, 5) == 1


async def test_token_records_are_kept_listed_and_replaced(store: Any) -> None:
    records = TokenRecords(store)
    await records.add("b2", '{"id": "b2"}')
    await records.add("a1", '{"id": "a1"}')
    assert await records.ids() == ["a1", "b2"]
    await records.replace("a1", '{"id": "a1", "revoked": true}')
    assert await records.get_many(["a1", "zz"]) == ['{"id": "a1", "revoked": true}', None]


# -- the change feeds and the archive's sets ---------------------------------------------------


async def test_the_change_feeds_are_grouped_claimed_measured_and_trimmed(store: Any) -> None:
    log = SessionLog(store)
    try:
        session_id = await _session(log)
        feed = SessionKeys(TENANT, session_id).feed
        feeds = ChangeFeeds(store, "projector", [feed])
        await feeds.ensure_groups()
        await feeds.ensure_groups()  # made already: nothing
        assert await feeds.nonempty() == [feed]
        assert await feeds.backlog() == 1
        assert await feeds.claim("p2", 0, 10) == []  # nothing delivered yet
        assert await feeds.trim(feed) == 0
    finally:
        log.close()


async def test_the_retention_sets_list_idle_and_deleted_sessions(store: Any) -> None:
    log = SessionLog(store)
    sets = RetentionSets(store)
    try:
        session_id = await _session(log)
        keys = SessionKeys(TENANT, session_id)
        partition = keys.partition
        assert (TENANT, session_id) in await sets.idle(partition, older_than=-60)
        assert await sets.idle(partition, older_than=3600) == []
        assert await sets.snapshot_field(TENANT, session_id, "seq") == "1"
        await sets.cooled(TENANT, session_id)
        assert await sets.idle(partition, older_than=-60) == []
        await sets.drop(TENANT, session_id)
        assert await sets.snapshot_field(TENANT, session_id, "seq") is None
        await sets.purged(TENANT, session_id)
        assert await sets.deleted(partition, older_than=-60) == []
    finally:
        log.close()
