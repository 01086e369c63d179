"""The directory archive store: one compressed file per session, written atomically.

A session's file is ``ROOT/<tenant>/<session id>.log.z`` (both names percent-quoted).
It is written to a temporary file beside it, flushed to disk, renamed over the old one
and the folder flushed: a crash leaves the old file or the new one, never a mix.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from urllib.parse import quote

SUFFIX = ".log.z"


class DirectoryArchive:
    """An :class:`~.base.ArchiveStore` in a local folder (single node, embedded default)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, tenant: str, session_id: str) -> Path:
        """Where the session's archive lives (whether or not it exists)."""
        return self.root / quote(tenant, safe="") / (quote(session_id, safe="") + SUFFIX)

    async def put(self, tenant: str, session_id: str, blob: bytes) -> None:
        await asyncio.to_thread(self._put, self.path(tenant, session_id), blob)

    async def get(self, tenant: str, session_id: str) -> bytes | None:
        return await asyncio.to_thread(self._get, self.path(tenant, session_id))

    async def delete(self, tenant: str, session_id: str) -> None:
        await asyncio.to_thread(self.path(tenant, session_id).unlink, missing_ok=True)

    async def close(self) -> None:
        return None

    @staticmethod
    def _put(path: Path, blob: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(blob)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself survives a power cut
        finally:
            os.close(folder)

    @staticmethod
    def _get(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
