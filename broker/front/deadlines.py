"""How long a client request may take, and what its client hears when it takes longer.

Every request is answered or failed within its deadline, whatever Redis or another role
does: a prompt turn within ``prompt_timeout`` seconds, anything else within
``request_timeout``. A request whose store is out of reach fails at once (after the
client's own reconnection attempts) with a clear error instead of ``internal error``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from ..config import Settings
from ..errors.store import store_unreachable
from ..protocol.jsonrpc import INTERNAL_ERROR, RpcError
from ..protocol.turns import PROMPT_OUTCOME
from ..store.errors import StoreError
from ..store.retry import STORE_AWAY, is_store_away

T = TypeVar("T")

LONG_METHODS = frozenset({"session/prompt", PROMPT_OUTCOME})
"""Methods bounded by ``prompt_timeout`` rather than ``request_timeout``."""


class DeadlinePassed(RpcError):
    """A request was not answered within its deadline."""


def deadline_for(method: str, settings: Settings) -> float:
    """Seconds a request for ``method`` may take before its client gets an error."""
    return settings.prompt_timeout if method in LONG_METHODS else settings.request_timeout


async def within_deadline(
    work: Awaitable[T],
    method: str,
    seconds: float,
    loop: asyncio.AbstractEventLoop | None = None,
) -> T:
    """``await work``, or raise :class:`RpcError` after ``seconds`` (the work is cancelled)
    or when the store cannot be reached (other store errors, a full store say, go on to the
    caller, which names them).

    What ``asyncio.timeout`` does, for the loop the caller holds: that one looks the loop up
    three times, and on Python 3.11 each lookup is a ``getpid()`` system call (µs each where
    system calls are dear). Must run in a task of ``loop``."""
    loop = loop or asyncio.get_running_loop()
    task = asyncio.current_task(loop)
    if task is None:
        raise RuntimeError("within_deadline runs in a task")
    cancelling = task.cancelling()
    expired: list[bool] = []

    def expire() -> None:
        expired.append(True)
        task.cancel()

    timer = loop.call_at(loop.time() + seconds, expire)
    try:
        return await work
    except asyncio.CancelledError:
        # Ours (no other cancellation asked for meanwhile) becomes the deadline's error.
        if expired:
            expired.clear()
            if task.uncancel() <= cancelling:
                raise DeadlinePassed(
                    INTERNAL_ERROR,
                    f"{method} was not answered within {seconds:g} s; try again shortly",
                ) from None
        raise
    except (*STORE_AWAY, StoreError) as exc:
        if not is_store_away(exc):
            raise
        raise store_unreachable(exc) from None
    finally:
        timer.cancel()
        if expired:  # expired as the work ended otherwise: take our cancellation back
            task.uncancel()
