"""ACP v2 methods, on the same sessions (and logs) as v1.

The shared handlers of :mod:`.methods_v1` do the work wherever the two versions
agree. This module holds what v2 changes: ``session/resume`` with
``replayFrom``, ``session/prompt`` answered on acceptance, the ``auth/*``
names, MCP server configs in their v2 shape; and it leaves out what v2
removed (``session/load``, ``session/set_mode``). Replies pass through
:func:`broker.protocol.v2.result` on the connection, updates through
:mod:`broker.protocol.v2_render`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from typing import Any

from ...protocol import v2, v2_render
from ...protocol.jsonrpc import REQUEST_CANCELLED, Request, RpcError, invalid_params
from ...protocol.turns import WITHDRAWN, client_prompt_id
from .attach import ATTACH_METHODS
from .connection import ClientConnection
from .dispatch import DEFERRED
from .interactions import INTERACTION_METHODS
from .methods_v1 import AcpMethods, MethodHandler
from .session_access import SESSION_ACCESS_METHODS

ACCEPT_TIMEOUT = 10.0
"""Seconds a finished turn's prompt event may take to reach the connection that sent it."""


async def session_new(methods: AcpMethods, conn: ClientConnection, request: Request) -> Any:
    """``session/new``: as v1, with the MCP server configs given to the agent in v1 shape."""
    return await methods.session_new(conn, _for_agent(request))


async def session_fork(methods: AcpMethods, conn: ClientConnection, request: Request) -> Any:
    """``session/fork`` (unstable): as v1, with the MCP server configs in v1 shape."""
    return await methods.session_fork(conn, _for_agent(request))


async def session_resume(methods: AcpMethods, conn: ClientConnection, request: Request) -> Any:
    """``session/resume``: the broker replays from its log as ``replayFrom`` asks, then answers.

    The agent is only asked to hold the session (load or resume, whatever it
    supports); what the client is replayed comes from the log.
    """
    request = _for_agent(request)
    reopened = await methods.reopen(conn, request, replay_default=None)
    snapshot = reopened.snapshot
    reopened.after = v2.replay_after(
        request.params.get("replayFrom"), epoch=snapshot.epoch, head=snapshot.given
    )
    return await methods.reattach(conn, request, reopened)


async def session_prompt(methods: AcpMethods, conn: ClientConnection, request: Request) -> Any:
    """``session/prompt``: answered ``{messageId}`` once the prompt is in the log (the id of
    the user message it inserted, or, for a prompt sent while a turn runs, will insert when
    its turn in the session's queue comes; its ``user_message`` update carries the same);
    the turn runs on.

    The answer precedes the prompt's ``user_message`` on this connection; every
    viewer then sees the turn's updates and its end as ``state_update``s. A prompt
    refused before it reached the log (content the agent did not advertise) is answered
    with the error; one withdrawn from the queue before its answer, with -32800.
    """
    session_id = methods.active_session(conn, request.params)
    if not isinstance(request.params.get("prompt"), list):
        raise invalid_params("prompt must be a list of content blocks")
    prompt_id = client_prompt_id(request.params) or secrets.token_hex(8)  # protocol.turns
    accepted = conn.expect_prompt(session_id, prompt_id)
    conn.hold(session_id)
    try:
        turn = conn.spawn(_run_turn(methods, conn, session_id, request, prompt_id))
        turn.add_done_callback(_retrieve)
        await asyncio.wait({turn, accepted}, return_when=asyncio.FIRST_COMPLETED)
        if not accepted.done():
            outcome = turn.result()  # refused before the log: answer with its error
            if outcome == WITHDRAWN:
                raise RpcError(REQUEST_CANCELLED, "the prompt was withdrawn before its turn")
            # The turn ended before its prompt event reached this connection: it is in
            # the log, so it is on its way here.
            await asyncio.wait_for(asyncio.shield(accepted), ACCEPT_TIMEOUT)
        conn.reply(request, {"messageId": v2_render.user_message_id(accepted.result())})
    finally:
        conn.forget_prompt(session_id, prompt_id)
        conn.release(session_id)
    return DEFERRED


async def _run_turn(
    methods: AcpMethods, conn: ClientConnection, session_id: str, request: Request, prompt_id: str
) -> Any:
    outcome = await methods.host.prompt(
        conn.tenant, session_id, request.params, conn.id, prompt_id, conn.principal
    )
    await methods.project(conn.tenant, session_id)
    return outcome.result


def _retrieve(task: asyncio.Task[Any]) -> None:
    """A turn's error after acceptance is in the log (idle ``state_update``): nothing to do."""
    if not task.cancelled():
        task.exception()


def _for_agent(request: Request) -> Request:
    return Request(request.method, v2.agent_params(request.params), request.id)


V2_HANDLERS: Mapping[str, MethodHandler] = {
    "session/new": session_new,
    "session/fork": session_fork,
    "session/resume": session_resume,
    "session/prompt": session_prompt,
    "session/cancel": AcpMethods.session_cancel,
    "session/set_config_option": AcpMethods.session_set_config_option,
    "session/set_title": AcpMethods.session_set_title,
    "session/close": AcpMethods.session_close,
    "session/delete": AcpMethods.session_delete,
    "session/list": AcpMethods.session_list,
    **INTERACTION_METHODS,
    **ATTACH_METHODS,
    **SESSION_ACCESS_METHODS,
    "auth/login": AcpMethods.authenticate,
    "auth/logout": AcpMethods.logout,
}
"""The v2 surface: every v2 method the broker answers (``session/set_title`` is an extension)."""
