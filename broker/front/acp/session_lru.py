"""Room for one more session on a connection: the least recently used idle ones let go.

A connection has at most ``max_sessions_per_connection`` sessions active (the bound keeps
a node's memory per connection in check). Editors open a session per thread and rarely
close them, so instead of refusing the next ``session/new`` (-32005), the connection stops
following the sessions it used least recently among those with no turn running (and so
no agent question pending: questions come within a turn). Each one let go stays whole in
the broker (a later ``session/load`` or ``session/resume`` brings it back) and the client
is told with a ``notice`` update on it, when it takes notices. Only when every session is
busy is the request refused.

:func:`pick` is the pure policy; :func:`make_room` applies it to a connection.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol

from ...config import Settings
from ...protocol import jsonrpc
from ...protocol.render import LET_GO_META, broker_notice
from ...store.events import SessionSnapshot
from .access import session_limit
from .session_state import ActiveSession

__all__ = ["LET_GO_META", "let_go_notice", "make_room", "pick", "used"]

_CLOCK = itertools.count(1)

SnapshotReader = Callable[[Sequence[tuple[str, str]]], Awaitable[list[SessionSnapshot | None]]]
"""What :func:`make_room` reads the sessions' snapshots with (``SessionLog.snapshots``)."""


class Following(Protocol):
    """The part of a client connection :func:`make_room` works on."""

    active: dict[str, ActiveSession]

    @property
    def settings(self) -> Settings: ...

    @property
    def sees_notices(self) -> bool: ...

    def prompting(self) -> set[str]: ...

    async def deactivate(self, session_id: str) -> None: ...

    def send(self, message: jsonrpc.JsonObject) -> None: ...


def used(session: ActiveSession) -> None:
    """The client used ``session`` now (made it active, or sent a request about it)."""
    session.used = next(_CLOCK)


def pick(used_at: Mapping[str, int], busy: Iterable[str], room: int) -> list[str]:
    """The sessions to let go so that ``room`` more fit: the least recently used of those
    not ``busy``, oldest first; fewer (maybe none) when too many are busy."""
    if room <= 0:
        return []
    busy = set(busy)
    idle = sorted((at, sid) for sid, at in used_at.items() if sid not in busy)
    return [sid for _, sid in idle[:room]]


async def make_room(conn: Following, snapshots: SnapshotReader) -> None:
    """Let go of the least recently used idle sessions of ``conn`` so that one more fits
    under its bound; -32005 when every session it has is busy."""
    bound = conn.settings.max_sessions_per_connection
    room = len(conn.active) - bound + 1
    if room <= 0:
        return
    sessions = list(conn.active.values())
    busy = set(conn.prompting())
    found = await snapshots([(s.tenant, s.session_id) for s in sessions])
    busy |= {s.session_id for s, snap in zip(sessions, found, strict=True) if _running(snap)}
    chosen = pick({s.session_id: s.used for s in sessions}, busy, room)
    if len(chosen) < room:
        raise session_limit(conn.settings)
    for session_id in chosen:
        await conn.deactivate(session_id)
        if conn.sees_notices:
            conn.send(_notice(session_id, bound))


def _running(snapshot: SessionSnapshot | None) -> bool:
    return snapshot is not None and snapshot.prompt_id is not None


def _notice(session_id: str, bound: int) -> jsonrpc.JsonObject:
    text = (
        f"This connection follows at most {bound} sessions: this one, used least recently "
        "and idle, was let go for a new one. Load or resume it to follow it again."
    )
    return let_go_notice(session_id, "Session no longer followed here", text)


def let_go_notice(session_id: str, title: str, text: str) -> jsonrpc.JsonObject:
    """The ``notice`` update that tells a client ``session_id`` is no longer active on its
    connection (``_meta[LET_GO_META]``), and why."""
    body = {"severity": "info", "title": title, "text": text}
    update = broker_notice(body)
    update["_meta"] = {**update["_meta"], LET_GO_META: True}
    params = {"sessionId": session_id, "update": update}
    return jsonrpc.notification("session/update", params)
