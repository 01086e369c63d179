"""The archive interface and the one format every store keeps a log in.

An archived log is a session's whole log up to ``seq`` under one epoch, kept as one
blob: zlib-compressed lines, a JSON header line then one line per event in seq order,
``<seq> <ts> <event JSON>`` (event JSON never holds a raw newline). The seqs run 1, 2, 3 …
but for those a rewound log skipped (seqs of events Redis lost in a failover: see
``store/floors.py``). zlib's checksum and the header's last seq make a damaged or truncated
blob an :class:`ArchiveCorrupt`, never a shorter log.
"""

from __future__ import annotations

import bisect
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

FORMAT_VERSION = 1


class ArchiveCorrupt(Exception):
    """An archived log cannot be read back whole (damaged, truncated, or not the session's)."""


@dataclass(frozen=True, slots=True)
class ArchivedLog:
    """One session's whole log as archived: its events up to ``seq`` of ``epoch``, in order."""

    tenant: str
    session_id: str
    epoch: str
    seq: int
    entries: Sequence[tuple[int, int, str]]
    """``(seq, ts, event JSON text)`` in seq order, the last at ``seq``: every seq from 1,
    but for the ones a rewound log skipped."""


class ArchiveStore(Protocol):
    """Where archived logs are kept: one blob per session, replaced whole.

    ``put`` returns only once the blob is durable (the caller then trims Redis);
    ``get`` returns ``None`` for a session with no archive; ``delete`` of a missing
    one is not an error. Stores never interpret a blob: :func:`encode` and
    :func:`decode` do."""

    async def put(self, tenant: str, session_id: str, blob: bytes) -> None: ...

    async def get(self, tenant: str, session_id: str) -> bytes | None: ...

    async def delete(self, tenant: str, session_id: str) -> None: ...

    async def close(self) -> None: ...


def encode(log: ArchivedLog) -> bytes:
    """The blob of ``log``."""
    header = {
        "v": FORMAT_VERSION,
        "tenant": log.tenant,
        "sid": log.session_id,
        "epoch": log.epoch,
        "seq": log.seq,
    }
    lines = [json.dumps(header, separators=(",", ":"))]
    lines += [f"{seq} {ts} {event}" for seq, ts, event in log.entries]
    return zlib.compress("\n".join(lines).encode(), 6)


def decode(blob: bytes, tenant: str, session_id: str) -> ArchivedLog:
    """The log in ``blob``, checked whole: raises :class:`ArchiveCorrupt` otherwise."""
    try:
        text = zlib.decompress(blob).decode()
        head, *lines = text.split("\n")
        header = json.loads(head)
        entries = []
        last = 0
        for number, line in enumerate(lines, 1):
            text, ts, event = line.split(" ", 2)
            seq = int(text)
            if seq <= last or (last == 0 and seq != 1):
                raise ValueError(f"entry {number} has seq {seq}, after {last or 'none'}")
            entries.append((seq, int(ts), event))
            last = seq
    except (zlib.error, UnicodeDecodeError, ValueError) as exc:
        raise ArchiveCorrupt(f"archive of session {session_id} is unreadable: {exc}") from None
    if header.get("v") != FORMAT_VERSION:
        raise ArchiveCorrupt(f"archive of session {session_id}: unknown format {header.get('v')}")
    if (header.get("tenant"), header.get("sid")) != (tenant, session_id):
        raise ArchiveCorrupt(f"archive of session {session_id} holds another session")
    if header.get("seq") != last:
        raise ArchiveCorrupt(
            f"archive of session {session_id} ends at seq {last}, not {header.get('seq')}"
        )
    return ArchivedLog(tenant, session_id, str(header["epoch"]), last, entries)


def entries_between(log: ArchivedLog, after: int, until: int) -> list[tuple[int, int, str]]:
    """The entries of ``log`` with ``after < seq <= until``."""
    entries = log.entries
    return list(entries[_index_after(entries, after) : _index_after(entries, until)])


def _index_after(entries: Sequence[tuple[int, int, str]], seq: int) -> int:
    """Where the entries after ``seq`` start: its index when the log skipped no seq."""
    if seq <= 0:
        return 0
    if seq <= len(entries) and entries[seq - 1][0] == seq:
        return seq
    return bisect.bisect_right(entries, seq, key=lambda entry: entry[0])
