"""Durable pending interactions at the host that holds the session.

An agent's ``session/request_permission`` or ``elicitation/create`` becomes an interaction
record (:mod:`broker.protocol.interactions`) that this host keeps while the agent waits, and
every transition of it is an ``interaction`` event in the session's log, written before
anyone acts on it:

* ``open`` is logged before a client hears the question; the question then goes to the
  session's windows as before (the first that can answer is asked, with
  ``_meta["acpBroker/interactionId"]``), and the record can be claimed, released and
  answered meanwhile by ``interaction/*`` requests, REST and the session tools;
* the answer is logged (``resolved``, with who resolved it) before the agent hears it; a
  window answering the agent's request directly claims and answers at once on its behalf;
* a claim that expires reopens the interaction (logged); the agent's turn ending first
  logs ``cancelled``; nobody answering within the client request timeout ``expired``.

The host is the session's single writer: a change is checked and made in one step of the
event loop (the compare-and-set), then logged; when the log refuses it, the change is
undone and the caller told so.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from broker.auth.roles import AclEntry, Authority, Permission
from broker.errors.failures import describe
from broker.errors.interactions import interaction_error, unknown_interaction
from broker.protocol.interactions import (
    PENDING,
    Interaction,
    InteractionRefused,
    State,
    claim_ttl,
    participant_id,
    response_of,
)
from broker.protocol.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, JsonObject, RpcError
from broker.store.events import EventType

from .clients import NOBODY, Answered
from .recorder import SessionRecorder
from .sessions import HeldSession

log = logging.getLogger(__name__)

INTERACTION_ID_META = "acpBroker/interactionId"
"""``_meta`` key naming the interaction in the request a window is asked."""
ENDED_KEPT = 50
"""Ended interactions a session remembers (a late answer to one is a clear conflict)."""
ACTIONS = frozenset({"list", "claim", "release", "respond"})
EXPIRY_MARGIN = 0.01
"""Seconds past a claim's expiry its timer is set again for, when it ran early."""

AskClients = Callable[[JsonObject], Awaitable[Answered]]


@dataclass(eq=False)
class Pending:
    """An interaction and the agent's wait for its answer."""

    record: Interaction
    answer: asyncio.Future[JsonObject]
    expiry: asyncio.TimerHandle | None = None
    claimant: Authority | None = None
    """What its current claim's principal claimed with (None: unknown, never fenced)."""
    then: list[JsonObject] = field(default_factory=list)
    """What is logged with its end (the turn runs again), when the turn still runs."""


class HostInteractions:
    """The interactions of the sessions held here; ``timeout``: how long one waits for
    an answer before it expires."""

    def __init__(self, recorder: SessionRecorder, timeout: float) -> None:
        self.recorder = recorder
        self.timeout = timeout
        self._background: set[asyncio.Task[None]] = set()

    async def ask(
        self, held: HeldSession, method: str, params: JsonObject, ask_clients: AskClients
    ) -> Any:
        """The answer to the agent's ``method`` request: from a window asked directly, or
        from whoever resolves the interaction first; each step logged."""
        loop = asyncio.get_running_loop()
        record = Interaction.opened(held.session_id, method, params, self.timeout)
        pending = Pending(record, loop.create_future())
        held.interactions[record.interaction_id] = pending
        _forget_ended(held)
        # The person's wait shows in the session's state (a turn that waits on them).
        waits = held.prompt_task is not None
        lead = [{"type": EventType.STATE, "state": "requires_action"}] if waits else []
        await self._log(held, record, lead)
        pending.then = [{"type": EventType.STATE, "state": "running"}] if waits else []
        given = params.get("_meta")
        meta: JsonObject = given if isinstance(given, dict) else {}
        asked = {**params, "_meta": {**meta, INTERACTION_ID_META: record.interaction_id}}
        clients = asyncio.ensure_future(ask_clients(asked))
        try:
            return await self._outcome(held, pending, clients, loop.time() + self.timeout)
        except asyncio.CancelledError:
            pending.then = []  # the turn is being cancelled: it does not run on
            await asyncio.shield(self._end(held, pending, State.CANCELLED))
            raise
        finally:
            clients.cancel()
            if pending.expiry is not None:
                pending.expiry.cancel()

    async def _outcome(
        self,
        held: HeldSession,
        pending: Pending,
        clients: asyncio.Future[Answered],
        deadline: float,
    ) -> Any:
        loop = asyncio.get_running_loop()
        waits: set[asyncio.Future[Any]] = {clients, pending.answer}
        while True:
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if pending.answer.done():
                return pending.answer.result()
            if not clients.done():
                break  # the deadline passed
            waits.discard(clients)
            try:
                answered = clients.result()
            except RpcError as exc:
                if not exc.message.startswith(NOBODY):
                    await self._end(held, pending, State.CANCELLED)
                    raise
                # No window can answer now: REST, a tool or a window opened later still can.
                continue
            try:
                return await self._resolve(held, pending, answered.result, answered.by, None)
            except RpcError:
                continue  # another holds a current claim: its answer is awaited
        await self._end(held, pending, State.EXPIRED)
        raise RpcError(
            INTERNAL_ERROR,
            f"nobody answered the {pending.record.kind} request within {self.timeout:g} s; "
            "it expired",
        )

    async def act(
        self,
        held: HeldSession | None,
        action: str,
        params: JsonObject,
        principal: str,
        authority: Authority | None = None,
    ) -> JsonObject:
        """``interaction/list``, ``claim``, ``release`` or ``respond`` by ``principal`` (its
        authority already checked by the front; kept with a claim: :meth:`fence`)."""
        if action not in ACTIONS:
            raise RpcError(INVALID_PARAMS, f"unknown interaction action {action!r}")
        if action == "list":
            records = [] if held is None else [p.record for p in held.interactions.values()]
            return {"interactions": [r.view() for r in records if r.state in PENDING]}
        interaction_id = str(params.get("interactionId") or "")
        pending = None if held is None else held.interactions.get(interaction_id)
        if held is None or pending is None:
            raise unknown_interaction(interaction_id)
        participant = participant_id(held.session_id, principal)
        attachment = str(params.get("attachmentId") or participant)
        record = pending.record
        now = time.time()
        try:
            if action == "respond":
                response = params.get("response")
                if not isinstance(response, dict):
                    raise InteractionRefused("invalid", "response must be an object")
                claim = None
                if "claimId" in params:  # the draft's form: only that claim may answer
                    claim = (params["claimId"], params.get("fencingToken"))
                result = response_of(record.kind, record.request, response)
                await self._resolve(held, pending, result, principal, params, claim, attachment)
                return {"interaction": pending.record.view()}
            before = copy.deepcopy(record)
            if action == "claim":
                ttl = claim_ttl(params.get("requestedTtlSeconds"))
                record.claim_for(participant, attachment, params.get("expectedRevision"), ttl, now)
                pending.claimant = authority
                self._expire_later(held, pending, ttl)
            else:
                record.release(
                    attachment, params.get("claimId"), params.get("fencingToken"),
                    params.get("expectedRevision"), now,
                )  # fmt: skip
        except InteractionRefused as exc:
            raise interaction_error(exc.condition, str(exc), exc.current) from None
        await self._logged(held, pending, before)
        return {"interaction": pending.record.view()}

    async def fence(self, held: HeldSession, entries: list[AclEntry]) -> None:
        """The session's ACL is now ``entries`` (a revoke): each claim whose holder lost
        ``session.approve`` by it is fenced, the interaction open again (logged, a new
        revision), so the old claim's answer is refused (``revision_conflict``)."""
        now = time.time()
        for pending in list(held.interactions.values()):
            claimant = pending.claimant
            if pending.record.state != State.CLAIMED or claimant is None:
                continue
            if claimant.allows(entries, Permission.APPROVE, now):
                continue
            before = copy.deepcopy(pending.record)
            pending.record.reopen()
            pending.claimant = None
            await self._logged(held, pending, before)

    async def _resolve(
        self,
        held: HeldSession,
        pending: Pending,
        result: JsonObject,
        principal: str,
        params: JsonObject | None,
        claim: tuple[Any, Any] | None = None,
        attachment: str | None = None,
    ) -> JsonObject:
        """Resolve (compare-and-set), log it, then let the agent have ``result``."""
        record = pending.record
        before = copy.deepcopy(record)
        expected = None if params is None else params.get("expectedRevision")
        by = participant_id(held.session_id, principal) if principal else "unknown"
        try:
            record.resolve(result, by, expected, time.time(), claim, attachment)
        except InteractionRefused as exc:
            raise interaction_error(exc.condition, str(exc), exc.current) from None
        await self._logged(held, pending, before)
        if not pending.answer.done():
            pending.answer.set_result(result)
        return result

    async def _logged(self, held: HeldSession, pending: Pending, before: Interaction) -> None:
        """Log the record's change; undone when the log does not take it."""
        try:
            await self._log(held, pending.record)
        except BaseException:
            pending.record = before
            raise

    async def _end(self, held: HeldSession, pending: Pending, state: State) -> None:
        if pending.record.end(state, time.time()):
            try:
                await self._log(held, pending.record)
            except Exception as exc:  # the agent hears the failure of its request anyway
                log.error(
                    "could not log that interaction %s is %s: %s",
                    pending.record.interaction_id, state.value, describe(exc),
                )  # fmt: skip

    def _expire_later(self, held: HeldSession, pending: Pending, ttl: float) -> None:
        if pending.expiry is not None:
            pending.expiry.cancel()
        pending.expiry = asyncio.get_running_loop().call_later(
            ttl, self._spawn_expiry, held, pending
        )

    def _spawn_expiry(self, held: HeldSession, pending: Pending) -> None:
        task = asyncio.ensure_future(self._expire(held, pending))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _expire(self, held: HeldSession, pending: Pending) -> None:
        """A claim's time is up: the interaction is open again, and every window sees so."""
        claim = pending.record.claim
        early = claim.expires - time.time() if claim is not None else 0.0
        if pending.record.state == State.CLAIMED and early > 0:
            # The timer ran ahead of the wall clock the claim's expiry is in (an event
            # loop's timers are coarser, and count from the time its iteration began):
            # due again when the claim is over, or it would never reopen.
            self._expire_later(held, pending, early + EXPIRY_MARGIN)
            return
        before = copy.deepcopy(pending.record)
        if not pending.record.expire_claim(time.time()):
            return
        try:
            await self._logged(held, pending, before)
        except Exception as exc:
            log.warning("could not log the expiry of a claim: %s", describe(exc))
            self._expire_later(held, pending, 1.0)  # tried again

    async def _log(
        self, held: HeldSession, record: Interaction, lead: list[JsonObject] | None = None
    ) -> None:
        """Log the record's state (with ``lead`` before it; when it ended, with what its
        end brings after it, while the turn runs): one round trip."""
        body: JsonObject = {"type": EventType.INTERACTION, "interaction": record.view()}
        pending = held.interactions.get(record.interaction_id)
        ending = record.state not in PENDING and pending is not None and held.prompt_task
        after = pending.then if ending and pending is not None else []
        await self.recorder.append_all(held, [*(lead or []), body, *after])
        if after and pending is not None:
            pending.then = []


def _forget_ended(held: HeldSession) -> None:
    ended = [key for key, p in held.interactions.items() if p.record.state not in PENDING]
    for key in ended[: max(0, len(ended) - ENDED_KEPT)]:
        del held.interactions[key]
