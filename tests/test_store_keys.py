"""broker.store.keys: the key scheme and its hash slots."""

from __future__ import annotations

import redis.crc
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store import keys

# -- keys -------------------------------------------------------------------------------------


def test_key_slot_known_values() -> None:
    assert keys.key_slot("foo") == 12182
    assert keys.key_slot("123456789") == 12739  # CRC16/XMODEM check value 0x31C3
    assert keys.key_slot("{user1000}.following") == keys.key_slot("{user1000}.followers")
    assert keys.key_slot("foo{bar}{zap}") == keys.key_slot("bar")
    assert keys.key_slot("foo{}{bar}") == redis.crc.key_slot(b"foo{}{bar}")
    assert keys.key_slot("foo{{bar}}zap") == keys.key_slot("{bar")
    assert keys.key_slot("foo{bar") == redis.crc.key_slot(b"foo{bar")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab{}:.x1é"), max_size=16) | st.text(max_size=16))
def test_key_slot_matches_redis_py(key: str) -> None:
    assert keys.key_slot(key) == redis.crc.key_slot(key.encode())


def test_partition_tags_fall_into_their_own_slot_ranges() -> None:
    width = keys.SLOTS // keys.PARTITIONS
    assert keys.PARTITIONS * width == keys.SLOTS
    seen = set()
    for partition in range(keys.PARTITIONS):
        tag = keys.partition_tag(partition)
        assert "{" not in tag and "}" not in tag
        slot = keys.key_slot(tag)
        assert partition * width <= slot < (partition + 1) * width, (partition, tag, slot)
        assert keys.key_slot(f"anything:{{{tag}}}:rest") == slot
        assert tag == f"p{partition}.{keys._find_tag_suffix(partition)}"
        seen.add(tag)
    assert len(seen) == keys.PARTITIONS
    assert len(keys._TAG_SUFFIXES) == keys.PARTITIONS


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_all_keys_of_a_session_share_one_slot(tenant: str, session_id: str) -> None:
    session = keys.SessionKeys(tenant, session_id)
    assert 0 <= session.partition < keys.PARTITIONS
    assert session.partition == keys.partition_of(session_id)
    names = [session.log, session.snapshot, session.meta, session.channel, session.feed]
    assert len(set(names)) == 5
    slots = {keys.key_slot(name) for name in names}
    assert slots == {keys.key_slot(keys.partition_tag(session.partition))}
    assert session.feed == keys.feed_key(session.partition)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=20))
def test_all_keys_of_a_tenant_share_one_slot(tenant: str, listing: str) -> None:
    tenant_keys = keys.TenantKeys(tenant)
    names = [tenant_keys.rows, tenant_keys.versions, tenant_keys.index(listing)]
    names.append(tenant_keys.index("acp"))
    assert len({keys.key_slot(name) for name in names}) == 1


def test_session_keys_differ_by_tenant() -> None:
    a, b = keys.SessionKeys("a", "sess_1"), keys.SessionKeys("b", "sess_1")
    assert a.partition == b.partition
    assert {a.log, a.snapshot, a.meta}.isdisjoint({b.log, b.snapshot, b.meta})


def test_partitions_spread_sessions() -> None:
    counts = [0] * keys.PARTITIONS
    for n in range(256 * 40):
        counts[keys.partition_of(f"sess_{n:08x}")] += 1
    assert min(counts) > 10 and max(counts) < 80
