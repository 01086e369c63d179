"""Per-connection state: the sessions active on a connection, and a batch's replies."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ...protocol.jsonrpc import JsonObject
from ...store.events import LogEvent


@dataclass(eq=False, slots=True)
class ActiveSession:
    """A session active on this connection and how far its events have been sent.

    Slots, and no list or dict until one is needed: every idle connection holds the
    sessions it resumed."""

    tenant: str
    session_id: str
    delivered: int = 0
    held: list[LogEvent] | None = None
    waiters: list[tuple[int, asyncio.Future[None]]] | None = None  # when any waits
    turn: int | None = None  # v2: the prompt turn in effect at ``delivered``
    prompts: dict[str, asyncio.Future[LogEvent]] | None = None  # by promptId, when asked
    prompt_ends: dict[str, asyncio.Future[LogEvent]] | None = None  # by promptId, when asked
    used: int = 0  # when the client last used it (session_lru: the least recent go first)
    subscriptions: frozenset[str] | None = None
    """A draft attachment's subscriptions (``session/attach``): what it is sent; None: an
    implicit attachment, sent what its ``initialize`` asked for."""
    barrier: str | None = None
    """A draft attachment's delivery barrier until its ``session/ready`` (events held)."""


@dataclass(eq=False)
class BatchReplies:
    """The replies to one JSON-RPC batch, sent as one array once all its requests are done."""

    replies: list[JsonObject] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
