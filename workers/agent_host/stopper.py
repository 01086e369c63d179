"""Stopping the sessions of a host that can no longer run: failed ones, recorded ``ERROR``
once the store takes it, and full ones (``max_events_per_session``), whose turn is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.errors.failures import describe
from broker.protocol.jsonrpc import RpcError
from broker.store.events import EventType, Status
from broker.store.leases import Leases
from broker.store.log import SessionFull, SessionMissing
from broker.store.retry import doubling, retry_store

from .recorder import STORE_AWAY_PAUSE, SessionRecorder
from .sessions import HeldSession, HeldSessions

log = logging.getLogger(__name__)

RUNAWAY_NOTICE = (
    "This session reached its event limit (max_events_per_session): the agent's turn was "
    "stopped and nothing more is recorded. Start a new session to go on."
)


class SessionStopper:
    """Stops running sessions here that failed or are full, and records why."""

    def __init__(
        self,
        sessions: HeldSessions,
        recorder: SessionRecorder,
        leases: Leases,
        cancel: Callable[[str, str], Awaitable[None]],
    ) -> None:
        self.sessions = sessions
        self.recorder = recorder
        self.leases = leases
        self.cancel = cancel
        self._background: set[asyncio.Task[Any]] = set()
        self._full: set[str] = set()  # sessions told they reached max_events_per_session

    def fail(self, held: HeldSession, reason: str) -> None:
        """Stop running a session whose updates were lost, and record it as failed."""
        log.error("session %s failed: %s", held.session_id, reason)
        self.stop_as_failed(held, reason)

    def stop_as_failed(self, held: HeldSession, reason: str) -> None:
        """Stop running a session here, and record it as failed (ERROR, with ``reason``)
        once the store takes it, however long it is away."""
        self.sessions.drop(held)
        task = asyncio.ensure_future(self._fail_when_back(held, reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _fail_when_back(self, held: HeldSession, reason: str) -> None:
        """Record the session as failed once the store answers again (its viewers see it)."""
        await retry_store(lambda: self._mark_error(held, reason), doubling(STORE_AWAY_PAUSE, 10.0))

    async def _mark_error(self, held: HeldSession, reason: str) -> None:
        with contextlib.suppress(SessionMissing, RpcError):
            await self.recorder.append(
                held, {"type": EventType.STATUS, "status": Status.ERROR, "reason": reason}
            )
        # No host takes an ERROR session over by itself: the next command brings it back.
        try:
            await self.leases.release(held.tenant, held.session_id)
            await self.leases.forget(held.tenant, held.session_id)
        except Exception as exc:  # the lease lapses by itself; the next command takes it over
            log.warning("could not release session %s: %s", held.session_id, describe(exc))

    def stop_runaway(self, held: HeldSession, full: SessionFull) -> None:
        """A session at ``max_events_per_session``: its viewers are told, once, and the
        running turn is cancelled (the bound leaves room for that bookkeeping)."""
        if held.session_id in self._full:
            return
        self._full.add(held.session_id)
        log.warning("session %s is full, its turn is stopped: %s", held.session_id, full)

        async def stop() -> None:
            notice = {
                "type": EventType.NOTICE,
                "severity": "error",
                "title": "This session is full",
                "text": f"{RUNAWAY_NOTICE} ({full})",
            }
            await self.recorder.append(held, notice)
            await self.cancel(held.tenant, held.session_id)

        task = asyncio.ensure_future(stop())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
