"""``session/attach``, ``session/ready`` and ``session/detach``: the ACP Remote draft's
attachments, for clients that negotiated the draft (``capabilities.remote`` at
``initialize``); others get -32601 (their ``session/new``, ``load`` and ``resume`` attach
them implicitly, and the session let go, or the connection closed, detaches them).

An attachment is one connection's on one session: its id is
:func:`~broker.protocol.interactions.attachment_id` of the two (so attaching again on the
same connection is the same attachment, and detaching twice is a no-op). ``session/attach``
makes the session active here with its events held (the replay ``replayFrom`` asks for,
then the live ones, in order) behind a delivery barrier; ``session/ready`` with that
barrier sends them and delivers live from then on. A barrier not acknowledged within
``attach_barrier_timeout`` (or a buffer past ``attach_buffer_events``) expires the
attachment. Detaching stops delivery and presence; the session runs on.

The draft's counters map onto the log: ``sessionEpoch`` is the log's epoch,
``sessionVersion`` the seq of the attach's replay/live boundary, and a ``sourceEventId``
is ``event_<epoch>_<seq>``.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import Any, Protocol

from ...auth.roles import Permission
from ...errors.interactions import FORBIDDEN, REVISION_CONFLICT
from ...protocol import jsonrpc
from ...protocol import presence as presence_protocol
from ...protocol.interactions import attachment_id, participant_id
from ...protocol.jsonrpc import JsonObject, Request, RpcError, invalid_params
from ...protocol.operations import negotiates_remote
from ...store.events import SessionSnapshot
from ..presence import PresenceBoard, session_roles
from ..session_acl import acl_of
from .connection import ClientConnection
from .params import session_id_of

SUBSCRIPTIONS = ("events", "pending_interactions", "presence")
CONTROL_POLICY = "ordered_multi_writer"
MAX_OPERATION_ID = 128
_EVENT_ID = re.compile(r"event_(?P<epoch>[^_]+)_(?P<seq>0|[1-9][0-9]{0,18})")


class SessionMethods(Protocol):
    """What these methods need of the connection's ACP methods (``AcpMethods``)."""

    presence: PresenceBoard

    async def _snapshot(self, conn: ClientConnection, params: JsonObject) -> SessionSnapshot: ...


def source_event_id(epoch: str, seq: int) -> str:
    """The draft's ``sourceEventId`` of the event at ``seq`` of log ``epoch``."""
    return f"event_{epoch}_{seq}"


def _draft_only(conn: ClientConnection, method: str) -> None:
    if not negotiates_remote(conn.client_capabilities):
        raise RpcError(
            jsonrpc.METHOD_NOT_FOUND,
            f"Method not found: {method} (negotiate capabilities.remote at initialize)",
        )


def _operation_id(params: JsonObject) -> str:
    value = params.get("operationId")
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_OPERATION_ID:
        raise invalid_params(f"operationId must be a string of 1 to {MAX_OPERATION_ID} characters")
    return value


def _subscriptions(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid_params("subscriptions must be a list of strings")
    if len(set(value)) != len(value):
        raise invalid_params("subscriptions must not repeat a value")
    unknown = [v for v in value if v not in SUBSCRIPTIONS]
    if unknown:
        raise invalid_params(
            f"unknown subscription {unknown[0]!r} (known: {', '.join(SUBSCRIPTIONS)})"
        )
    return list(value)


def _replay_after(params: JsonObject, snapshot: SessionSnapshot) -> tuple[int | None, bool]:
    """Where the replay starts (None: at the live boundary) and whether the cursor was
    unknown (the ``snapshot_required`` recovery)."""
    if "replayFrom" not in params:
        return None, False
    value = params["replayFrom"]
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "start":
        return 0, False
    if kind == "after_event":
        assert isinstance(value, dict)
        source = value.get("sourceEventId")
        if not isinstance(source, str) or not source:
            raise invalid_params("replayFrom.sourceEventId must be a non-empty string")
        found = _EVENT_ID.fullmatch(source)
        if found is None or found["epoch"] != snapshot.epoch or int(found["seq"]) > snapshot.given:
            return None, True  # unknown here: never say whether it existed
        return int(found["seq"]), False
    raise invalid_params(
        "replayFrom must be an object whose type is 'start' or 'after_event' (omit it for none)"
    )


def barrier_conflict(message: str) -> RpcError:
    """A ``session/ready`` whose barrier is not the attachment's current one."""
    data = {
        "condition": REVISION_CONFLICT,
        "retryable": False,
        "conflictDomain": "attachment_barrier",
    }
    return RpcError(jsonrpc.INVALID_REQUEST, message, data)


async def session_attach(methods: SessionMethods, conn: ClientConnection, request: Request) -> Any:
    """``session/attach``: see the module's docstring."""
    _draft_only(conn, request.method)
    params = request.params
    session_id = session_id_of(params)
    _operation_id(params)
    if not isinstance(params.get("attachmentCapabilities"), dict):
        raise invalid_params("attachmentCapabilities must be an object ({} offers none)")
    wanted = _subscriptions(params.get("subscriptions"))
    snapshot = await methods._snapshot(conn, params)
    after, unknown_cursor = _replay_after(params, snapshot)
    try:
        head = await conn.activate(conn.tenant, session_id, replay_after=after, replay_now=False)
    except RpcError:
        if after is None:
            raise
        # The log no longer holds what follows the cursor: attach at the live boundary.
        head = await conn.activate(conn.tenant, session_id, replay_after=None, replay_now=False)
        unknown_cursor = True
    roles, permissions = session_roles(conn.principal, session_id, acl_of(snapshot).entries)
    effective = [s for s in wanted if s != "presence" or Permission.PRESENCE in permissions]
    barrier = f"barrier_{secrets.token_hex(12)}"
    conn.sessions.subscribe(session_id, frozenset(effective))
    session = conn.active[session_id]
    session.barrier = barrier
    conn.hold(session_id)
    conn.spawn(_expire_unready(conn, session_id, barrier))
    recovery: JsonObject = (
        {"type": "snapshot_required", "condition": "cursor_gap"}
        if unknown_cursor
        else {"type": "event_replay", "latestSourceEventId": source_event_id(snapshot.epoch, head)}
    )
    subject = conn.principal.subject if conn.principal is not None else ""
    return {
        "attachmentId": attachment_id(session_id, conn.id),
        "attachmentRevision": "1",
        "participantId": participant_id(session_id, subject),
        "roles": roles,
        "effectivePermissions": permissions,
        "sessionEpoch": snapshot.epoch,
        "sessionVersion": str(head),
        "controlPolicy": CONTROL_POLICY,
        "recovery": recovery,
        "deliveryBarrierId": barrier,
        "effectiveSubscriptions": effective,
        "_meta": {"acpBroker/barrierTimeoutSeconds": conn.settings.attach_barrier_timeout},
    }


async def _expire_unready(conn: ClientConnection, session_id: str, barrier: str) -> None:
    """Expire the attachment when its barrier is still unacknowledged after the timeout."""
    await asyncio.sleep(conn.settings.attach_barrier_timeout)  # a deadline, not a poll
    session = conn.active.get(session_id)
    if session is not None and session.barrier == barrier:
        await conn.sessions.expire(session_id, "no session/ready within the barrier timeout")


def _own_attachment(conn: ClientConnection, params: JsonObject) -> str:
    """The request's ``sessionId``, whose ``attachmentId`` must be this connection's."""
    session_id = session_id_of(params)
    given = params.get("attachmentId")
    if not isinstance(given, str) or not given:
        raise invalid_params("attachmentId must be a non-empty string")
    if given != attachment_id(session_id, conn.id):
        raise RpcError(
            jsonrpc.INVALID_REQUEST,
            "attachmentId does not name an attachment of this connection",
            {"condition": FORBIDDEN, "retryable": False},
        )
    return session_id


async def session_ready(methods: SessionMethods, conn: ClientConnection, request: Request) -> Any:
    """``session/ready``: the delivery barrier crossed; held events go, then live ones."""
    _draft_only(conn, request.method)
    params = request.params
    session_id = _own_attachment(conn, params)
    barrier = params.get("deliveryBarrierId")
    if not isinstance(barrier, str) or not barrier:
        raise invalid_params("deliveryBarrierId must be a non-empty string")
    _operation_id(params)
    session = conn.active.get(session_id)
    if session is None or session.barrier is None:
        raise barrier_conflict("the attachment is not waiting at a barrier (expired, or ready)")
    if session.barrier != barrier:
        raise barrier_conflict("deliveryBarrierId is not the attachment's current barrier")
    session.barrier = None
    conn.release(session_id)
    if session.subscriptions and "presence" in session.subscriptions:
        revision, entries = await methods.presence.snapshot(conn.tenant, session_id)
        update = presence_protocol.snapshot_update(revision, entries)
        conn.send(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": session_id, "update": update},
            }
        )
    return {}


async def session_detach(methods: SessionMethods, conn: ClientConnection, request: Request) -> Any:
    """``session/detach``: delivery and presence stop; the session runs on. Idempotent."""
    _draft_only(conn, request.method)
    session_id = _own_attachment(conn, request.params)
    _operation_id(request.params)
    if session_id in conn.active:
        await conn.deactivate(session_id)
    return {}


ATTACH_METHODS = {
    "session/attach": session_attach,
    "session/ready": session_ready,
    "session/detach": session_detach,
}
"""The methods, as the v1 and v2 surfaces list them."""
