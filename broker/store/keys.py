"""The Redis key scheme.

Every key of a session carries the hash tag of the session's *partition*, so
the append script touches one slot and stays legal in Redis Cluster. Every
per-tenant index key carries the tenant's own hash tag, so one list call
touches one slot. Session keys also carry the tenant: a session id looked up
under another tenant names keys that do not exist, which is how a foreign id
comes to answer exactly like a missing one.

Partition tags are chosen once, deterministically, so that the ``P`` tags fall
into ``P`` evenly spaced slot ranges of the cluster's 16384 slots.
"""

from __future__ import annotations

import hashlib
from functools import cache, lru_cache

from redis import crc

PARTITIONS = 256
"""How many partitions sessions are spread over (fixed for a deployment)."""

SLOTS = crc.REDIS_CLUSTER_HASH_SLOTS
PREFIX = "acpb"


def key_slot(key: str) -> int:
    """The cluster slot of ``key``, honouring ``{hash tags}`` (as redis-py computes it)."""
    return crc.key_slot(key.encode())


def _find_tag_suffix(partition: int) -> int:
    """The first suffix ``n`` for which tag ``p<partition>.<n>`` hashes into the
    partition's slot range (a few hundred CRCs at most)."""
    width = SLOTS // PARTITIONS
    low = partition * width
    suffix = 0
    while not low <= key_slot(f"p{partition}.{suffix}") < low + width:
        suffix += 1
    return suffix


_TAG_SUFFIXES = tuple(_find_tag_suffix(partition) for partition in range(PARTITIONS))
"""Computed at import (some 65,000 CRCs, tens of ms); a test checks every tag's range."""


@cache
def partition_tag(partition: int) -> str:
    """A hash tag whose slot lies in the ``partition``-th of ``PARTITIONS`` equal slot ranges."""
    return f"p{partition}.{_TAG_SUFFIXES[partition]}"


def partition_of(session_id: str) -> int:
    """The partition a session belongs to (stable across processes and versions)."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % PARTITIONS


class SessionKeys:
    """The keys (and the live channel) of one session, all in one slot."""

    __slots__ = (
        "channel",
        "deleted",
        "feed",
        "hot",
        "lease",
        "log",
        "member",
        "meta",
        "partition",
        "session_id",
        "snapshot",
        "tenant",
    )

    def __init__(self, tenant: str, session_id: str) -> None:
        self.tenant = tenant
        self.session_id = session_id
        self.partition = partition_of(session_id)
        tag = partition_tag(self.partition)
        base = f"{PREFIX}:{{{tag}}}:t:{tenant}:s:{session_id}"
        self.log = f"{base}:log"
        self.snapshot = f"{base}:snap"
        self.meta = f"{base}:meta"
        self.channel = f"{base}:live"
        self.lease = f"{base}:lease"
        self.feed = feed_key(self.partition)
        self.hot = hot_key(self.partition)
        self.deleted = deleted_key(self.partition)
        self.member = session_member(tenant, session_id)


@lru_cache(maxsize=4096)
def session_keys(tenant: str, session_id: str) -> SessionKeys:
    """:class:`SessionKeys`, kept for the sessions used last: an agent host appends to the
    same sessions again and again, and making the keys (a hash and nine strings) was a
    sixth of a batch append's own CPU (``bench fanout`` S=1000/W=2's feeder). Callers must
    not change what they are given."""
    return SessionKeys(tenant, session_id)


def feed_key(partition: int) -> str:
    """The change feed of one partition: one notice per append, read by projectors."""
    return f"{PREFIX}:{{{partition_tag(partition)}}}:feed"


def feed_bell(feed: str) -> str:
    """The shard channel, in the change feed ``feed``'s slot, on which appenders ring on a
    Redis Cluster (``broker/store/feed_bell.py``): a projector waits for it, not polling."""
    return f"{feed}:bell"


def hot_key(partition: int) -> str:
    """The sessions of one partition whose log is in Redis, scored by their last append (ms):
    the archiving role finds idle ones here."""
    return f"{PREFIX}:{{{partition_tag(partition)}}}:hot"


def deleted_key(partition: int) -> str:
    """The deleted sessions of one partition, scored by deletion time (ms), until purged."""
    return f"{PREFIX}:{{{partition_tag(partition)}}}:deleted"


def session_member(tenant: str, session_id: str) -> str:
    """A session as a member of a partition set: ``tenant<TAB>session id``."""
    return f"{tenant}\t{session_id}"


def split_member(member: str) -> tuple[str, str]:
    """``(tenant, session id)`` of a :func:`session_member`."""
    tenant, _, session_id = member.rpartition("\t")
    return tenant, session_id


class TenantKeys:
    """The materialized index of one tenant, all in one slot."""

    __slots__ = ("rows", "tenant", "versions")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        base = f"{PREFIX}:{{t:{tenant}}}"
        self.rows = f"{base}:rows"
        self.versions = f"{base}:ver"

    def index(self, name: str) -> str:
        """A lexicographically ordered sorted set of index entries, one per listing."""
        return f"{PREFIX}:{{t:{self.tenant}}}:ix:{name}"


def tenants_key() -> str:
    """The set of tenants that have sessions (for rebuilds and admin tools)."""
    return f"{PREFIX}:tenants"


def lease_key(tenant: str, session_id: str) -> str:
    """Which agent host holds a session (value: host id; expires unless renewed)."""
    return SessionKeys(tenant, session_id).lease


def leases_key() -> str:
    """Every held session (``tenant<TAB>session id``) scored by its lease's expiry, in ms."""
    return f"{PREFIX}:leases"


def host_inbox(host_id: str) -> str:
    """The command stream of one agent host."""
    return f"{PREFIX}:host:{host_id}:inbox"


INBOX_MAXLEN = 10_000
"""How many commands a host's inbox (and the shared queue) keeps, approximately."""

CAPABILITIES_KEY = f"{PREFIX}:agents:capabilities"
"""Hash: agent name -> its ``agentCapabilities`` (JSON), written by hosts as agents start."""


def host_queue() -> str:
    """Commands any agent host may take (new sessions, sessions no host holds)."""
    return f"{PREFIX}:hosts:queue"


def command_taken_key(rid: str) -> str:
    """Set by the first agent host that takes a command creating a session (``rid``: the
    call id a front gives it, the same on every copy it sends): a copy sent again because
    the acknowledgement came late finds it and is not run a second time."""
    return f"{PREFIX}:hosts:taken:{rid}"


INDEX_CHANNEL = f"{PREFIX}:index:changed"
"""The shard channel on which every writer of the session index names, once per batch of
writes, each tenant whose index it changed (the message is the tenant): fronts drop their
cached pages of that tenant (``broker/front/pages.py``). One channel, so on a Redis Cluster
it lives on one shard and every front's one subscription there hears every change."""


def node_channel(node_id: str) -> str:
    """The shard channel where a front node receives replies and agent requests."""
    return f"{PREFIX}:node:{node_id}"
