"""Durable pending interactions: an agent's question to a person, as a record with a lifecycle.

Pure: the record, its state machine and its views, no I/O. The agent host holding a session
keeps its records (``workers.agent_host.interactions``) and logs every transition as an
``interaction`` event, so the lifecycle replays, survives a front's loss and reaches every
attachment like any update.

Names follow the ACP Remote multi-client draft (provisional): an interaction has an
``interactionId``, a ``kind`` (``permission``, ``elicitation``), a decimal-string
``revision`` that every transition increments, and a ``state`` tagged by ``type``:

* ``open``: anyone allowed to answer may claim or answer it;
* ``claimed``: one participant holds it (``claimId``, ``fencingToken``, ``expiresAt``);
  only that claim may answer; when it expires the interaction is ``open`` again;
* ``resolved`` (``resolvedAt``, ``result``, ``resolvedBy``), ``cancelled`` (the agent's
  turn no longer needs it) and ``expired`` (nobody answered in time): terminal.

Every change is a compare-and-set on the revision the caller read: a stale one is refused
with ``revision_conflict`` and changes nothing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from .jsonrpc import JsonObject

KINDS = {"session/request_permission": "permission", "elicitation/create": "elicitation"}
"""The agent requests that become interactions, and their kind."""

REQUIRED_PERMISSION = "session.approve"
DEFAULT_CLAIM_TTL = 60.0
"""Seconds a claim lasts when the claimant asks for no other duration."""
MAX_CLAIM_TTL = 600.0
EVENT_META = "acpBroker/interaction"
"""``_meta`` key of the ``session_info_update`` that carries an interaction's new state."""
ELICITATION_ACTIONS = frozenset({"accept", "decline", "cancel"})
INTERACTION_ID = re.compile(r"interaction_[0-9a-f]{1,64}")


class State(StrEnum):
    OPEN = "open"
    CLAIMED = "claimed"
    RESOLVED = "resolved"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


TERMINAL = frozenset({State.RESOLVED, State.CANCELLED, State.EXPIRED})
PENDING = frozenset({State.OPEN, State.CLAIMED})


class InteractionRefused(Exception):
    """A change the record refuses: ``condition`` (``revision_conflict``, ``invalid``)
    says which, ``current`` is the record's view then."""

    def __init__(self, condition: str, message: str, current: JsonObject | None = None) -> None:
        super().__init__(message)
        self.condition = condition
        self.current = current


def participant_id(session_id: str, principal: str) -> str:
    """The participant a principal is in one session: stable within it, unlinkable across
    sessions, and not the principal's id (peers see it in presence and in claims)."""
    return _pseudonym("participant", session_id, principal)


def attachment_id(session_id: str, connection_id: str) -> str:
    """A connection's attachment to one session, as peers may see it (not its id)."""
    return _pseudonym("attachment", session_id, connection_id)


def _pseudonym(kind: str, session_id: str, name: str) -> str:
    digest = hashlib.sha256(f"{kind}\0{session_id}\0{name}".encode()).hexdigest()
    return f"{kind}_{digest[:16]}"


def iso(at: float) -> str:
    """A wall-clock time as the drafts write it (RFC 3339, UTC, milliseconds)."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class Claim:
    claim_id: str
    participant: str
    attachment: str
    fencing_token: int
    expires: float


@dataclass(slots=True)
class Interaction:
    """One pending question of an agent and its lifecycle."""

    interaction_id: str
    reverse_request_id: str
    session_id: str
    kind: str
    request: JsonObject
    created: float
    expires: float | None = None
    state: State = State.OPEN
    revision: int = 1
    fence: int = 0
    claim: Claim | None = None
    ended: float | None = None
    result: JsonObject | None = None
    resolved_by: str | None = None
    preferred: str | None = None
    extra: JsonObject = field(default_factory=dict)

    @classmethod
    def opened(
        cls, session_id: str, method: str, params: JsonObject, timeout: float | None = None
    ) -> Interaction:
        """A new ``open`` interaction for an agent's ``method`` request (its ``params``, less
        the session id, are the question as the agent asked it)."""
        now = time.time()
        return cls(
            interaction_id=f"interaction_{secrets.token_hex(12)}",
            reverse_request_id=f"reverse_{secrets.token_hex(12)}",
            session_id=session_id,
            kind=KINDS[method],
            request={k: v for k, v in params.items() if k != "sessionId"},
            created=now,
            expires=None if timeout is None else now + timeout,
        )

    # -- views -------------------------------------------------------------------------------

    def view(self) -> JsonObject:
        """The record as the draft writes it (every attachment's view: the broker has no
        per-recipient redaction yet)."""
        out: JsonObject = {
            "interactionId": self.interaction_id,
            "reverseRequestId": self.reverse_request_id,
            "sessionId": self.session_id,
            "kind": self.kind,
            "revision": str(self.revision),
            "createdAt": iso(self.created),
            "requiredPermission": REQUIRED_PERMISSION,
            "state": self.state_view(),
            "request": self.request,
        }
        if self.expires is not None:
            out["expiresAt"] = iso(self.expires)
        return out

    def state_view(self) -> JsonObject:
        state: JsonObject = {"type": self.state.value}
        if self.state == State.CLAIMED and self.claim is not None:
            state.update(
                claimId=self.claim.claim_id,
                participantId=self.claim.participant,
                attachmentId=self.claim.attachment,
                fencingToken=str(self.claim.fencing_token),
                expiresAt=iso(self.claim.expires),
            )
        elif self.state == State.RESOLVED:
            state.update(resolvedAt=iso(self.ended or 0.0), resolvedBy=self.resolved_by)
            if self.result is not None:
                state["result"] = self.result
        elif self.state in TERMINAL:
            state[f"{self.state.value}At"] = iso(self.ended or 0.0)
        return state

    # -- transitions -------------------------------------------------------------------------

    def _check(self, expected: Any) -> None:
        if self.state in TERMINAL:
            raise InteractionRefused(
                "revision_conflict", f"the interaction is {self.state.value}", self.view()
            )
        if expected is not None and str(expected) != str(self.revision):
            raise InteractionRefused(
                "revision_conflict",
                f"stale revision {expected}: the interaction is at revision {self.revision}",
                self.view(),
            )

    def claim_for(
        self, participant: str, attachment: str, expected: Any, ttl: float, now: float
    ) -> Claim:
        """``open`` → ``claimed`` by ``participant`` for ``ttl`` seconds (a claim past its
        expiry counts as released)."""
        self.expire_claim(now)
        self._check(expected)
        if self.state == State.CLAIMED:
            raise InteractionRefused(
                "revision_conflict", "the interaction is claimed by another", self.view()
            )
        self.fence += 1
        self.claim = Claim(
            f"claim_{secrets.token_hex(8)}", participant, attachment, self.fence, now + ttl
        )
        self.state = State.CLAIMED
        self.revision += 1
        return self.claim

    def _own_claim(self, attachment: str, claim_id: Any, fencing_token: Any, now: float) -> None:
        """Refused unless ``attachment`` holds the current claim ``claim_id`` at
        ``fencing_token`` (every viewer sees the claim's id: knowing it is not owning it)."""
        claim = self.claim
        owned = (
            self.state == State.CLAIMED
            and claim is not None
            and claim.attachment == attachment
            and claim.claim_id == claim_id
            and str(claim.fencing_token) == str(fencing_token)
            and claim.expires > now
        )
        if not owned:
            raise InteractionRefused(
                "revision_conflict",
                "the claim is not current (expired, released or another's)",
                self.view(),
            )

    def release(
        self, attachment: str, claim_id: Any, fencing_token: Any, expected: Any, now: float
    ) -> None:
        """``claimed`` → ``open``, by the claim's holder ``attachment``."""
        self._check(expected)
        self._own_claim(attachment, claim_id, fencing_token, now)
        self.claim = None
        self.state = State.OPEN
        self.revision += 1

    def reopen(self) -> None:
        """``claimed`` → ``open``: the claim's holder lost the authority it claimed with."""
        self.claim = None
        self.state = State.OPEN
        self.revision += 1

    def expire_claim(self, now: float) -> bool:
        """A claim past its expiry: the interaction is ``open`` again (True when it was)."""
        if self.state == State.CLAIMED and self.claim is not None and self.claim.expires <= now:
            self.claim = None
            self.state = State.OPEN
            self.revision += 1
            return True
        return False

    def resolve(
        self,
        result: JsonObject,
        by: str,
        expected: Any,
        now: float,
        claim: tuple[Any, Any] | None = None,
        attachment: str | None = None,
    ) -> None:
        """→ ``resolved`` with ``result``. With ``claim`` (its id and fencing token) only
        that current claim may; without, the caller claims and answers at once (REST, the
        tools, a client answering the agent's request directly): refused while another
        holds a current claim. ``by``: the participant answering (recorded);
        ``attachment``: its attachment (the claim's owner; default ``by``)."""
        owner = attachment or by
        self.expire_claim(now)
        self._check(expected)
        if claim is not None:
            self._own_claim(owner, claim[0], claim[1], now)
        elif self.state == State.CLAIMED and self.claim and self.claim.attachment != owner:
            raise InteractionRefused(
                "revision_conflict", "the interaction is claimed by another", self.view()
            )
        self.result = result
        self.resolved_by = by
        self._end(State.RESOLVED, now)

    def end(self, state: State, now: float) -> bool:
        """The agent no longer waits (``cancelled``) or nobody answered (``expired``):
        True when this changed a pending interaction."""
        if self.state in TERMINAL:
            return False
        self._end(state, now)
        return True

    def _end(self, state: State, now: float) -> None:
        self.claim = None
        self.state = state
        self.ended = now
        self.revision += 1


def response_of(kind: str, request: JsonObject, body: JsonObject) -> JsonObject:
    """The agent's answer an answering body stands for, checked against the question.

    A permission: ``{"optionId": …}`` (one of the options the agent sent) or the ACP
    response itself (``{"outcome": {"outcome": "selected", "optionId": …}}``). An
    elicitation: ``{"action": "accept"|"decline"|"cancel", "content": {…}}``.
    Raises :class:`InteractionRefused` (``invalid``) for anything else.
    """
    if kind == "permission":
        outcome = body.get("outcome")
        option = outcome.get("optionId") if isinstance(outcome, dict) else body.get("optionId")
        options = request.get("options")
        known = (
            [o.get("optionId") for o in options if isinstance(o, dict)]
            if isinstance(options, list)
            else []
        )
        if not isinstance(option, str) or option not in known:
            raise InteractionRefused(
                "invalid", f"optionId must be one of the options the agent sent: {known}"
            )
        return {"outcome": {"outcome": "selected", "optionId": option}}
    action = body.get("action")
    if action not in ELICITATION_ACTIONS:
        raise InteractionRefused("invalid", "action must be accept, decline or cancel")
    if action != "accept":
        return {"action": action}
    content = body.get("content", {})
    if not isinstance(content, dict):
        raise InteractionRefused("invalid", "content must be an object")
    return {"action": "accept", "content": content}


def claim_ttl(value: Any) -> float:
    """The claim duration asked for (``requestedTtlSeconds``, a number or decimal string),
    bounded; the default when none. Raises :class:`InteractionRefused` for a bad one."""
    if value is None:
        return DEFAULT_CLAIM_TTL
    try:
        ttl = float(value)
    except (TypeError, ValueError):
        raise InteractionRefused("invalid", "requestedTtlSeconds must be a number") from None
    if not 0 < ttl <= MAX_CLAIM_TTL:
        raise InteractionRefused(
            "invalid", f"requestedTtlSeconds must be in (0, {MAX_CLAIM_TTL:g}]"
        )
    return ttl


def summary(view: JsonObject) -> JsonObject:
    """An interaction (its :meth:`Interaction.view`) as REST and the tools list it: ``id``,
    ``kind``, ``state`` (a word), ``revision``, the question and, for a permission, its
    ``options`` as the agent sent them; who holds a claim, who resolved it and how."""
    state = view.get("state") or {}
    request = view.get("request") or {}
    out: JsonObject = {
        "id": view.get("interactionId"),
        "kind": view.get("kind"),
        "state": state.get("type"),
        "revision": view.get("revision"),
        "createdAt": view.get("createdAt"),
        "request": request,
    }
    if view.get("kind") == "permission":
        out["options"] = request.get("options", [])
    for name in ("participantId", "expiresAt", "resolvedBy", "result"):
        if name in state:
            out["claimedBy" if name == "participantId" else name] = state[name]
    return out


def info_update(view: JsonObject) -> JsonObject:
    """An interaction's new state as every viewer hears of it (v1 and v2): a
    ``session_info_update`` whose ``_meta`` carries the record."""
    return {"sessionUpdate": "session_info_update", "_meta": {EVENT_META: view}}


HOST_LOST = "host_lost"
"""Why an interaction a lost agent host left pending was cancelled (``_meta`` reason)."""
REASON_META = "acpBroker/reason"


def cancelled_for_host_loss(view: JsonObject, now: float) -> JsonObject:
    """The terminal record of an interaction (its last logged ``view``) whose agent host
    died while it was pending: ``cancelled`` (the draft's state for a question its asker
    no longer needs), one revision on, with ``_meta["acpBroker/reason"]`` ``host_lost``
    (the draft has no reason field). Its claim, if any, ends with it."""
    given = str(view.get("revision") or "0")
    revision = (int(given) if given.isdigit() else 0) + 1
    state: JsonObject = {
        "type": State.CANCELLED.value,
        "cancelledAt": iso(now),
        "_meta": {REASON_META: HOST_LOST},
    }
    return {**view, "revision": str(revision), "state": state}
