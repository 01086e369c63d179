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
from ..protocol.jsonrpc import INTERNAL_ERROR, RpcError
from ..store.retry import STORE_AWAY

T = TypeVar("T")

LONG_METHODS = frozenset({"session/prompt"})
"""Methods bounded by ``prompt_timeout`` rather than ``request_timeout``."""


class DeadlinePassed(RpcError):
    """A request was not answered within its deadline."""


def deadline_for(method: str, settings: Settings) -> float:
    """Seconds a request for ``method`` may take before its client gets an error."""
    return settings.prompt_timeout if method in LONG_METHODS else settings.request_timeout


def store_unreachable(exc: BaseException) -> RpcError:
    """The error a client sees when the session store failed its request."""
    return RpcError(
        INTERNAL_ERROR,
        f"the session store is unreachable ({type(exc).__name__}: {exc}); try again shortly",
    )


async def within_deadline(work: Awaitable[T], method: str, seconds: float) -> T:
    """``await work``, or raise :class:`RpcError` after ``seconds`` (the work is cancelled)
    or when the store cannot be reached (other store errors, a full store say, go on to the
    caller, which names them)."""
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise DeadlinePassed(
            INTERNAL_ERROR, f"{method} was not answered within {seconds:g} s; try again shortly"
        ) from None
    except STORE_AWAY as exc:
        raise store_unreachable(exc) from None
