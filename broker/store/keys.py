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
from functools import cache

PARTITIONS = 256
"""How many partitions sessions are spread over (fixed for a deployment)."""

SLOTS = 16384
PREFIX = "acpb"


def _crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    """The cluster slot of ``key``, honouring ``{hash tags}``."""
    raw = key.encode()
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return _crc16(raw) % SLOTS


# The first suffix ``n`` for which tag ``p<partition>.<n>`` hashes into the
# partition's slot range; computed once by ``_find_tag_suffix`` and checked by a test.
_TAG_SUFFIXES = (
    239,
    441,
    174,
    39,
    244,
    220,
    76,
    1,
    78,
    441,
    452,
    436,
    53,
    76,
    233,
    257,
    154,
    1,
    103,
    167,
    312,
    376,
    202,
    266,
    17,
    32,
    110,
    174,
    48,
    376,
    165,
    101,
    463,
    25,
    147,
    123,
    202,
    3,
    255,
    231,
    79,
    134,
    401,
    279,
    13,
    36,
    260,
    204,
    401,
    279,
    237,
    6,
    79,
    116,
    456,
    432,
    260,
    204,
    15,
    30,
    75,
    50,
    136,
    152,
    41,
    64,
    115,
    171,
    317,
    373,
    160,
    5,
    317,
    373,
    272,
    216,
    137,
    153,
    65,
    40,
    164,
    100,
    229,
    26,
    119,
    320,
    69,
    230,
    67,
    42,
    313,
    377,
    70,
    55,
    133,
    157,
    45,
    60,
    462,
    406,
    76,
    53,
    401,
    279,
    242,
    226,
    352,
    68,
    150,
    134,
    327,
    28,
    401,
    279,
    45,
    60,
    260,
    204,
    237,
    253,
    114,
    170,
    259,
    421,
    169,
    0,
    41,
    64,
    153,
    137,
    179,
    340,
    420,
    258,
    104,
    160,
    373,
    317,
    73,
    56,
    66,
    43,
    442,
    426,
    311,
    128,
    201,
    265,
    71,
    54,
    0,
    210,
    442,
    426,
    55,
    70,
    223,
    247,
    274,
    210,
    35,
    10,
    377,
    313,
    406,
    462,
    157,
    133,
    267,
    203,
    451,
    229,
    108,
    331,
    24,
    254,
    157,
    133,
    59,
    164,
    126,
    142,
    477,
    38,
    26,
    250,
    0,
    340,
    79,
    142,
    351,
    168,
    30,
    15,
    372,
    316,
    476,
    412,
    421,
    259,
    144,
    120,
    209,
    471,
    139,
    300,
    61,
    44,
    209,
    471,
    223,
    26,
    166,
    102,
    69,
    426,
    30,
    15,
    223,
    247,
    473,
    417,
    122,
    22,
    451,
    229,
    32,
    17,
    302,
    366,
    72,
    57,
    302,
    366,
    267,
    203,
    41,
    64,
    175,
    111,
    360,
    159,
    21,
    214,
    140,
    124,
    411,
    269,
    45,
    60,
    117,
    173,
    52,
    77,
    337,
    353,
)


def _find_tag_suffix(partition: int) -> int:
    """Search for the tag suffix of ``partition`` (how ``_TAG_SUFFIXES`` was made)."""
    width = SLOTS // PARTITIONS
    low = partition * width
    suffix = 0
    while not low <= _crc16(f"p{partition}.{suffix}".encode()) % SLOTS < low + width:
        suffix += 1
    return suffix


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
        "feed",
        "lease",
        "log",
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


def feed_key(partition: int) -> str:
    """The change feed of one partition: one notice per append, read by projectors."""
    return f"{PREFIX}:{{{partition_tag(partition)}}}:feed"


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


def host_queue() -> str:
    """Commands any agent host may take (new sessions, sessions no host holds)."""
    return f"{PREFIX}:hosts:queue"


def node_channel(node_id: str) -> str:
    """The shard channel where a front node receives replies and agent requests."""
    return f"{PREFIX}:node:{node_id}"
