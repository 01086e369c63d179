"""One command order per session: prompts that come while a turn runs wait their turn.

A prompt that reaches the host holding a session while a turn runs there (or others wait)
is logged as ``prompt_queued`` and waits in the session's FIFO queue: the host's commands
for a session arrive through one inbox, in one order, whichever window, front, REST or MCP
sent them, so the queue is the session's command order. When the turn before it ends (its
end in the log), the first waiting prompt runs. A queued prompt cancelled by its activity
id (its prompt id) leaves the queue (``prompt_withdrawn``) and is answered
``{"stopReason": "cancelled"}`` (marked ``_meta["acpBroker/withdrawn"]``); a cancel of an
activity that already ended is logged as ``cancel_ignored`` (a late cancel changes nothing,
and says so). A queued prompt whose author lost ``session.write`` on the session before its
turn came is not run: it is withdrawn the same way, with ``reason: "revoked"``
(:func:`revoked`; the host decides at commit: ``Authority.allows``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from broker.auth.roles import Authority
from broker.protocol.jsonrpc import JsonObject
from broker.store.events import EventType, Position

from .sessions import HeldSession, Queued

if TYPE_CHECKING:
    from .recorder import SessionRecorder


def busy(held: HeldSession) -> bool:
    """Whether a prompt arriving now must wait (a turn runs, or prompts wait already)."""
    return held.prompt_task is not None or bool(held.queue)


async def enter(
    held: HeldSession,
    recorder: SessionRecorder,
    prompt_id: str,
    origin: str,
    params: JsonObject,
    author: str = "",
    authority: Authority | None = None,
) -> Queued:
    """Log the prompt as queued and wait for its turn (or its withdrawal by ``author``)."""
    body: JsonObject = {
        "type": EventType.PROMPT_QUEUED,
        "promptId": prompt_id,
        "origin": origin,
        "prompt": params.get("prompt", []),
    }
    entry = Queued(prompt_id, author=author, authority=authority)
    held.queue.append(entry)
    try:
        entry.seq = (await recorder.append(held, body)).seq
        # Woken by the end of the turn before (even one that ended while this was logged:
        # the entry was queued first), or by a withdrawal.
        await asyncio.shield(entry.turn)
    except BaseException:
        leave(held, entry)
        raise
    return entry


def leave(held: HeldSession, entry: Queued) -> None:
    """``entry`` no longer waits (its request failed or was cancelled): the next may go
    once nothing runs."""
    if entry in held.queue:
        held.queue.remove(entry)
    if held.prompt_task is None:
        wake_next(held)


def wake_next(held: HeldSession) -> None:
    """The first waiting prompt's turn has come (it stays first in the queue until it runs:
    a prompt arriving meanwhile queues behind it)."""
    if held.queue and not held.queue[0].turn.done():
        held.queue[0].turn.set_result(None)


async def withdraw(held: HeldSession, recorder: SessionRecorder, activity_id: str, by: str) -> None:
    """Cancel a prompt that waits its turn (``by`` its author, when it has one), or log
    that the activity was not there to cancel (ended, or another's)."""
    entry = next((q for q in held.queue if q.prompt_id == activity_id and not q.turn.done()), None)
    if entry is None or (entry.author and entry.author != by):
        body: JsonObject = {"type": EventType.CANCEL_IGNORED, "activityId": activity_id}
        if entry is not None:
            body["reason"] = "not_author"  # only its author withdraws a queued prompt
        await recorder.append(held, body)
        return
    index = held.queue.index(entry)
    held.queue.remove(entry)
    try:
        body = {
            "type": EventType.PROMPT_WITHDRAWN,
            "promptId": activity_id,
            "stopReason": "cancelled",  # its request's answer (an end, for outcome readers)
        }
        position = await recorder.append(held, body)
    except BaseException:
        held.queue.insert(index, entry)
        raise
    entry.turn.set_result(position)


async def revoked(held: HeldSession, recorder: SessionRecorder, entry: Queued) -> Position:
    """``entry``'s turn came but its author may no longer prompt the session: it leaves the
    queue unrun, withdrawn with the reason logged (its request answered as withdrawn)."""
    body: JsonObject = {
        "type": EventType.PROMPT_WITHDRAWN,
        "promptId": entry.prompt_id,
        "stopReason": "cancelled",
        "reason": "revoked",
    }
    try:
        return await recorder.append(held, body)
    finally:
        leave(held, entry)  # the next waiting prompt goes, withdrawn logged or not


def fail_all(held: HeldSession, error: BaseException) -> None:
    """The session is let go (stopped, deleted): every prompt still waiting fails with
    ``error`` rather than run on a session no longer held."""
    waiting, held.queue[:] = list(held.queue), []
    for entry in waiting:
        if not entry.turn.done():
            entry.turn.set_exception(error)
