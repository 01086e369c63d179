"""``_acpBroker/prompt_outcome``: the answer of a prompt whose connection dropped.

A client names its prompt (``_meta["acpBroker/promptId"]``, see
:mod:`broker.protocol.turns`); when its connection drops, the turn runs on at its agent
host. Once reconnected, with the session resumed on the new connection, the client asks
for the outcome and gets what the prompt request would have been answered, after every
event of the turn up to its end was sent on this connection (as ``session/prompt``
answers; a v2 client, as v2 answers a prompt: ``{messageId}`` once the prompt is in the
log, its turn's end coming as a ``state_update``). A prompt the log shows no trace of
within :data:`LOST_GRACE` seconds never reached the agent: the client is told so (-32603)
and may send it again.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from ...protocol import v2, v2_render
from ...protocol.jsonrpc import INTERNAL_ERROR, Request, RpcError
from ...protocol.turns import outcome_of, outcome_query
from ...store.events import EventType, LogEvent
from .connection import ClientConnection
from .methods_v1 import AcpMethods

LOST_GRACE: Final = 5.0
"""Seconds a prompt that is not in the log yet may take to get there (its command may still
be on its way to an agent host) before it counts as lost."""
LOOK_BACK: Final = 4096
"""Events read back from the log's head for an ended turn's end (a turn's end is recent)."""


async def prompt_outcome(methods: AcpMethods, conn: ClientConnection, request: Request) -> Any:
    """Answer ``_acpBroker/prompt_outcome`` ``{sessionId, promptId}`` (see the module)."""
    session_id, prompt_id = outcome_query(request.params)
    methods.active_session(conn, {"sessionId": session_id})  # -32002 unless active here
    if conn.protocol_version == v2.V2:
        return await _accepted(methods, conn, session_id, prompt_id)
    ending = conn.expect_prompt_end(session_id, prompt_id)  # before looking: none missed
    try:
        end = await _logged_end(methods, conn, session_id, prompt_id, ending)
        await conn.wait_delivered(session_id, end.seq)
        return outcome_of(end.body)
    finally:
        conn.forget_prompt_end(session_id, prompt_id)


async def _accepted(
    methods: AcpMethods, conn: ClientConnection, session_id: str, prompt_id: str
) -> Any:
    """v2: a prompt is answered once it is in the log (``{messageId}``), as
    ``session/prompt`` is; its turn's end reaches the client as a ``state_update``."""
    accepted = conn.expect_prompt(session_id, prompt_id)  # before looking: none missed
    try:
        snapshot = await methods.log.snapshot(conn.tenant, session_id)
        events = await methods.log.read(
            conn.tenant, session_id, after=max(0, snapshot.seq - LOOK_BACK), until=snapshot.seq
        )
        found = [e for e in events if e.type in _ACCEPTED and _named(e, prompt_id)]
        if found:
            return {"messageId": v2_render.user_message_id(found[-1])}
        try:
            event = await asyncio.wait_for(asyncio.shield(accepted), LOST_GRACE)
        except TimeoutError:
            raise _lost() from None
        return {"messageId": v2_render.user_message_id(event)}
    finally:
        conn.forget_prompt(session_id, prompt_id)


_ACCEPTED = (EventType.PROMPT, EventType.PROMPT_QUEUED)


def _named(event: LogEvent, prompt_id: str) -> bool:
    return event.body.get("promptId") == prompt_id


LOST_REASON: Final = "prompt_lost"
"""``data.reason`` of the error that says a prompt never reached its agent."""


def _lost() -> RpcError:
    return RpcError(
        INTERNAL_ERROR,
        "the prompt never reached the session's agent (its connection dropped first): "
        "send it again",
        {"reason": LOST_REASON},
    )


async def _logged_end(
    methods: AcpMethods,
    conn: ClientConnection,
    session_id: str,
    prompt_id: str,
    ending: asyncio.Future[LogEvent],
) -> LogEvent:
    """The ``prompt_end`` event of the prompt: in the log already, or once it is there."""
    snapshot = await methods.log.snapshot(conn.tenant, session_id)
    if snapshot.prompt_id == prompt_id:
        return await ending  # running now: its end comes live
    events = await methods.log.read(
        conn.tenant, session_id, after=max(0, snapshot.seq - LOOK_BACK), until=snapshot.seq
    )
    for event in reversed(events):
        if event.body.get("promptId") != prompt_id:
            continue
        if event.type in (EventType.PROMPT_END, EventType.PROMPT_WITHDRAWN):
            return event
        if event.type in (EventType.PROMPT, EventType.PROMPT_QUEUED):
            return await ending  # began (or waits its turn): its end comes live
    try:
        return await asyncio.wait_for(asyncio.shield(ending), LOST_GRACE)
    except TimeoutError:
        raise _lost() from None
