"""Loopback TCP plumbing for the tests' proxies (:mod:`.balancer`, :mod:`.redis_proxy`)."""

from __future__ import annotations

import asyncio

CONNECT_TIMEOUT = 2.0
"""Seconds a proxy waits to reach its backend."""


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until either side goes away, then close ``writer``
    (the other direction's pipe closes the other side, as a balancer does)."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # one side went away: the other is closed below
    finally:
        writer.close()
