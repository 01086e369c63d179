"""Logging a host's sessions: the agents' updates, batched and kept in order while the
store is away, and the host's own events after them."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker.ops import metrics
from broker.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, RpcError
from broker.store.events import EventType
from broker.store.log import Fenced, Position, SessionFull, SessionLog, call_ids
from broker.store.retry import STORE_AWAY, retry_store
from broker.store.window import window_event

from .sessions import HeldSession, HeldSessions

if TYPE_CHECKING:
    from .process import AgentProcess

log = logging.getLogger(__name__)

APPEND_BATCH = 16

APPEND_RETRY_PAUSES = (0.2, 0.4, 0.8, 1.6)
"""Seconds between attempts to log an agent's updates while the store is unreachable."""

STORE_AWAY_PAUSE = 1.0
"""Seconds between attempts once those are spent: the updates wait, kept in order."""

_FORK_COPIES = frozenset(
    {EventType.UPDATE, EventType.PROMPT, EventType.PROMPT_END, EventType.STATE}
)
"""What a fork's log copies of its parent's: the conversation, not the parent's own life
(its creation, statuses, agent bindings) nor the broker's notices (live only)."""


def _fork_copies(body: JsonObject) -> bool:
    """Whether a fork copies this event of its parent's (no notice: they are live only)."""
    update = body.get("update")
    if isinstance(update, dict) and update.get("sessionUpdate") == "notice":
        return False
    return body.get("type") in _FORK_COPIES


class _Failed(Exception):
    """The updates of a batch were given up on (their sessions are failed)."""


class Stopper(Protocol):
    """What the recorder does with a session it cannot log for (:class:`SessionStopper`)."""

    def fail(self, held: HeldSession, reason: str) -> None: ...

    def stop_runaway(self, held: HeldSession, full: SessionFull) -> None: ...


class SessionRecorder:
    """Appends to the log of the sessions held here, in the order things happened."""

    def __init__(
        self, session_log: SessionLog, sessions: HeldSessions, *, max_pending_updates: int
    ) -> None:
        self.log = session_log
        self.sessions = sessions
        self.max_pending_updates = max_pending_updates
        self.stopper: Stopper  # set by the host: they call on each other
        self._updates: list[tuple[HeldSession, JsonObject]] = []  # waiting for the log
        self._appender: asyncio.Future[None] | None = None
        self._store_away = False

    async def make_ready(self, held: HeldSession) -> None:
        held.ready = True
        early, held.early = held.early, []
        for body in early:  # queued at once, so that later updates queue behind them
            self.queue_update(held, body)
        await self.settle()

    async def append(self, held: HeldSession, body: JsonObject, *, kept: bool = False) -> Position:
        """Log one of the host's own events, after the agent's updates so far. Tried for a
        few seconds while the store is away (:meth:`log_retrying`); ``kept``: until the
        store takes it (:meth:`log_until_back`)."""
        return await self.append_all(held, [body], kept=kept)

    async def append_all(
        self, held: HeldSession, bodies: list[JsonObject], *, kept: bool = False
    ) -> Position:
        """:meth:`append` of several events, in order, in one round trip (one wait for the
        agent's updates so far): where the last landed."""
        await self.settle()  # the agent's updates so far go first: the log keeps their order
        items = [(held.tenant, held.session_id, body, held.fence) for body in bodies]
        results = await (self.log_until_back(items) if kept else self.log_retrying(items))
        for result in results:
            if isinstance(result, Fenced):
                self.sessions.lose(held.session_id)
                raise RpcError(INTERNAL_ERROR, "the session moved to another agent host")
            if isinstance(result, Exception):
                raise result
        last = results[-1]
        assert isinstance(last, Position)
        return last

    async def end_prompt(
        self,
        held: HeldSession,
        prompt_id: str,
        *,
        result: JsonObject | None = None,
        error: JsonObject | None = None,
    ) -> Position:
        """Log the end of a prompt turn: the agent's whole result, or the error.

        Kept until the store takes it, however long it is away (its request has its own
        deadline on the front): a turn whose end never reached the log would run for ever
        to every viewer of the session, and a v2 client, answered once its prompt was
        logged, hears the end from the log only. A new prompt waits for it
        (:attr:`HeldSession.ending`), so that it does not go into the log before it."""
        body: JsonObject = {"type": EventType.PROMPT_END, "promptId": prompt_id}
        if error is not None:
            body["error"] = error
        else:
            body["stopReason"] = (result or {}).get("stopReason")
            body["result"] = result or {}
        ending = held.ending = asyncio.get_running_loop().create_future()
        try:
            return await self.append(held, body, kept=True)
        finally:
            held.ending = None
            ending.set_result(None)

    async def log_window(
        self, held: HeldSession, reply: Any, *, mode_id: str | None = None
    ) -> None:
        """Log what the agent's reply said of the session's window (modes, config options,
        models), so that any front answers a later load or resume with it (store/window.py)."""
        body = window_event(reply, mode_id=mode_id)
        if body is not None:
            await self.append(held, body)

    async def copy_history(self, held: HeldSession, bodies: list[JsonObject]) -> int:
        """Append a parent's history events to a fork's log, in order; returns the last seq."""
        last = 1
        copies = [body for body in bodies if _fork_copies(body)]
        for start in range(0, len(copies), APPEND_BATCH):
            batch = copies[start : start + APPEND_BATCH]
            items = [(held.tenant, held.session_id, body, held.fence) for body in batch]
            for result in await self.log_retrying(items):
                if isinstance(result, Exception):
                    raise RpcError(INTERNAL_ERROR, f"could not copy the history: {result}")
                last = result.seq
        return last

    async def settle(self, agent: AgentProcess | None = None) -> None:
        """Return once every agent update received so far is in the log."""
        while self._appender is not None and not self._appender.done():
            await asyncio.shield(self._appender)

    def queue_update(self, held: HeldSession, body: JsonObject) -> None:
        """Log an agent's update soon, in order: the updates that arrive while an append is
        on its way go to the log together, in one round trip, once it is back."""
        self._updates.append((held, body))
        if self._appender is None or self._appender.done():
            self._appender = asyncio.ensure_future(self._append_updates())

    async def _append_updates(self) -> None:
        while self._updates:
            # At most 16 a round trip: a session knows its last 16 appends, so a batch
            # tried again after an unknown outcome lands each of its updates once.
            batch, self._updates = self._updates[:APPEND_BATCH], self._updates[APPEND_BATCH:]
            items = [(h.tenant, h.session_id, body, h.fence) for h, body in batch]
            try:
                results = await self._log_kept(batch, items)
            except _Failed:
                continue
            except Exception as exc:  # the store refused them: trying again would not help
                log.error(
                    "could not log %d agent updates: %s: %s", len(items), type(exc).__name__, exc
                )
                for held in {id(h): h for h, _ in batch}.values():
                    self.stopper.fail(
                        held, f"agent updates could not be logged ({type(exc).__name__})"
                    )
                continue
            for (held, _), result in zip(batch, results, strict=True):
                if isinstance(result, Fenced):
                    self.sessions.lose(held.session_id)
                elif isinstance(result, SessionFull):
                    self.stopper.stop_runaway(held, result)
                elif isinstance(result, Exception):
                    log.warning("update of %s not logged: %s", held.session_id, result)

    async def _log_kept(
        self, batch: list[tuple[HeldSession, JsonObject]], items: list[Any]
    ) -> list[Position | Exception]:
        """Log a batch of updates until the store takes it (:meth:`log_until_back`) while
        the updates waiting fit; past that their sessions are failed and :class:`_Failed`
        raised."""
        return await self.log_until_back(items, lambda exc: self._keep_or_fail(exc, batch))

    async def log_until_back(
        self,
        items: list[tuple[str, str, JsonObject, str]],
        keep: Callable[[BaseException], bool] | None = None,
    ) -> list[Position | Exception]:
        """Log ``items``, however long the store is out of reach, with the same call ids
        each time (an append whose outcome was unknown lands once); ``keep``, asked after
        each failure, may give up (False: :class:`_Failed` is raised)."""
        calls = call_ids(len(items))
        try:
            return await retry_store(
                lambda: self.log_retrying(items, calls),
                itertools.repeat(STORE_AWAY_PAUSE),
                keep=keep,
            )
        except STORE_AWAY:  # keep gave up
            raise _Failed from None

    def _keep_or_fail(
        self, exc: BaseException, batch: list[tuple[HeldSession, JsonObject]]
    ) -> bool:
        """Updates are waiting for a store that is away: say so once an outage, and fail the
        sessions whose updates no longer fit in ``max_pending_updates`` (False then)."""
        if not self._store_away:
            self._store_away = True
            log.warning(
                "the session store is unreachable (%s: %s): keeping %d agent updates until "
                "it is back",
                type(exc).__name__,
                exc,
                len(self._updates),
            )
        metrics.UPDATES_WAITING.set(len(batch) + len(self._updates))
        if len(batch) + len(self._updates) <= self.max_pending_updates:
            return True
        lost: dict[str, tuple[HeldSession, int]] = {}
        for held, _ in [*batch, *self._updates]:
            lost[held.session_id] = (held, lost.get(held.session_id, (held, 0))[1] + 1)
        self._updates = []
        for held, count in lost.values():
            reason = (
                f"{count} agent updates could not be logged: the session store was "
                f"unreachable for too long ({type(exc).__name__}: {exc})"
            )
            self.stopper.fail(held, reason)
        return False

    async def log_retrying(
        self, items: list[tuple[str, str, JsonObject, str]], calls: list[str] | None = None
    ) -> list[Position | Exception]:
        """Append, trying again while the store is unreachable (a failover takes a second or
        two): the same calls, so an append that did land the first time lands only once.
        Raises the last failure when the store stays out of reach."""
        calls = calls or call_ids(len(items))
        appended = await retry_store(
            lambda: self.log.append_many(items, calls), APPEND_RETRY_PAUSES
        )
        return self._store_back(appended)

    def _store_back(self, results: list[Position | Exception]) -> list[Position | Exception]:
        if self._store_away:
            self._store_away = False
            metrics.UPDATES_WAITING.set(0)
            log.warning("the session store answers again: logging the agent updates kept")
        return results
