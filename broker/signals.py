"""Waiting for the signals that end a process's role (SIGINT, SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import signal


async def until_stopped() -> None:
    """Return when the process is asked to stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
