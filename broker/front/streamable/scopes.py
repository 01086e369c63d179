"""Which stream each message of a Streamable HTTP connection travels on, and what a POST
must say of it (pure: no I/O).

The transport RFD gives a connection one connection-scoped GET stream and one per session.
A message about a session (its ``params.sessionId``: updates, agent-to-client requests)
goes on that session's stream; a response goes where its request came from: the stream of
the session the request named, else the connection's (``session/new``'s answer, which
names a session the client has no stream for yet, ``session/list``'s, ...). So
``session/load``'s answer follows the session's replayed history on one stream, in order.
"""

from __future__ import annotations

import json
from typing import Any

from ...store.http_links import CONNECTION_SCOPE, session_scope

NO_SESSION_METHODS = frozenset({"session/new", "session/list", "initialize", "authenticate"})
"""Requests whose answer goes on the connection stream whatever their params say."""


class ScopeError(ValueError):
    """A POST whose headers disagree with its message (HTTP 400)."""


def id_key(msg_id: Any) -> str:
    """A request id as a dict key that keeps ``1`` and ``"1"`` apart."""
    return json.dumps(msg_id)


def named_session(message: Any) -> str | None:
    """The ``params.sessionId`` of a message, if it names one."""
    if not isinstance(message, dict):
        return None
    params = message.get("params")
    session_id = params.get("sessionId") if isinstance(params, dict) else None
    return session_id if isinstance(session_id, str) and session_id else None


def incoming_scope(message: Any, header_session: str | None) -> str | None:
    """The scope a POSTed request's answer goes to (None: the message is no request).

    Raises :class:`ScopeError` when the message names a session and the POST's
    ``Acp-Session-Id`` is missing or names another (the RFD's 400).
    """
    session_id = named_session(message)
    if session_id is not None and header_session != session_id:
        if header_session is None:
            raise ScopeError("a message about a session needs the Acp-Session-Id header")
        raise ScopeError("Acp-Session-Id does not match the message's params.sessionId")
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    if session_id is None or message.get("method") in NO_SESSION_METHODS:
        return CONNECTION_SCOPE
    return session_scope(session_id)


def outgoing_scope(message: Any, replies: dict[str, str]) -> str:
    """The scope of a message the connection sends: a response's is its request's (taken
    from ``replies``, by :func:`id_key`); any other's the session it names, else the
    connection's. A batch array goes where its first message goes."""
    if isinstance(message, list):
        return outgoing_scope(message[0], replies) if message else CONNECTION_SCOPE
    if not isinstance(message, dict):
        return CONNECTION_SCOPE
    if "method" not in message:
        return replies.pop(id_key(message.get("id")), CONNECTION_SCOPE)
    session_id = named_session(message)
    return CONNECTION_SCOPE if session_id is None else session_scope(session_id)
