"""Archive stores: where idle sessions' logs live once they leave Redis.

:class:`~.base.ArchiveStore` is the one narrow interface (put, get, delete of one
session's whole log as one compressed blob); :func:`open_archive` picks a store from
its location: a directory (``dir:PATH`` or a plain path) or PostgreSQL
(``postgresql://…``). An object store needs only those three methods.
"""

from __future__ import annotations

from .base import ArchiveCorrupt, ArchivedLog, ArchiveStore, decode, encode, entries_between
from .directory import DirectoryArchive

__all__ = [
    "ArchiveCorrupt",
    "ArchiveStore",
    "ArchivedLog",
    "DirectoryArchive",
    "decode",
    "encode",
    "entries_between",
    "open_archive",
]


def open_archive(location: str) -> ArchiveStore:
    """The archive store at ``location``: ``postgresql://…`` (or ``postgres://…``), else a
    directory (``dir:PATH`` or ``PATH``), created if missing."""
    if location.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresArchive  # asyncpg only where it is used

        return PostgresArchive(location)
    return DirectoryArchive(location.removeprefix("dir:"))
