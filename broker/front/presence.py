"""Presence on one front: the attachments its connections hold, kept in the store and logged.

A session becoming active on a connection (``session/attach``, or for any client a
``session/new``, ``load``, ``resume`` or ``fork``) is an attachment; the session let go
(``session/detach``, ``session/close``, the connection closing, the session evicted) ends it.
The board writes each change to the session's presence hash (``store/presence.py``, read
by REST, MCP and attach) and appends a ``presence`` event to the session's log (so it
replays and fans out to every window following presence, on every front), in the order
they happened, from one loop: a connection's request never waits for presence.

The same loop, every third of ``presence_ttl``: refreshes this front's entries (a killed
front's lapse within ``presence_ttl``), marks attachments ``away`` after
``presence_idle_after`` seconds without a request on their session (a request brings them
back ``online``), and sweeps the lapsed entries of the sessions it has attachments in
(logging their ``left``, once: the front whose delete took the entry logs it).

Presence is never read to authorize anything; :func:`session_roles` is what an attachment's
roles are (one place): presence shows the credential's tenant roles, an attach's answer
adds the session's ACL entries it read with the snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..auth.principal import Principal
from ..auth.roles import Role, effective, permissions_of, tenant_roles
from ..config import Settings
from ..protocol import presence
from ..protocol.interactions import attachment_id, participant_id
from ..protocol.jsonrpc import JsonObject
from ..store.events import SessionSnapshot
from ..store.log import SessionArchived, SessionLog, SessionMissing
from ..store.presence import PresenceStore
from .session_acl import acl_of

log = logging.getLogger(__name__)

ALL_ROLES = frozenset(Role)

BATCH = 512
"""The most changes one write of the loop takes."""

GATHER_SECONDS = 0.05
"""The loop writes at most once in this time: a change after a quiet spell is written at
once, those that come sooner gather until it has passed, so that a connect storm's thousands
of joins are a few writes and a few ``presence`` events, not one each (each event is
appended, published and read by every front)."""

MAX_QUEUED_WRITES = 10_000
"""Presence writes a front keeps waiting for the store; past it new ones are dropped (a
store away for long: entries then lapse and come back with the next refresh)."""


class Attendee(Protocol):
    """What presence reads of a connection."""

    id: str
    principal: Principal | None
    display_name: str | None


def session_roles(
    principal: Principal | None, snapshot: SessionSnapshot | None
) -> tuple[list[str], list[str]]:
    """The roles ``principal`` holds on the session and the permissions they grant (sorted
    names): its live entries in the session's ACL (``snapshot``; None: the session is not
    known) and its credential's own roles, as every authorization decides
    (:mod:`..session_acl`)."""
    if principal is None:
        return [], []
    if snapshot is None:
        roles = tenant_roles(principal)
    else:
        roles = effective(acl_of(snapshot).entries, principal, time.time())
    return sorted(roles), sorted(permissions_of(roles, principal))


@dataclass(slots=True)
class Attachment:
    """One connection's attachment to one session, as this front keeps it."""

    conn_id: str
    tenant: str
    session_id: str
    attachment_id: str
    participant_id: str
    roles: list[str]
    display_name: str | None
    principal: Principal | None = None  # whose roles ``roles`` are (never shown)
    state: str = presence.ONLINE
    last_active: float = field(default_factory=time.time)
    written: float = 0.0
    """When its entry was last put or refreshed in the store (``time.monotonic()``)."""

    def entry(self) -> JsonObject:
        """The stored entry: the public fields only (privacy: see ``protocol/presence``)."""
        out: JsonObject = {
            "attachmentId": self.attachment_id,
            "participantId": self.participant_id,
            "roles": self.roles,
            "state": self.state,
            "lastActiveAt": presence.coarse_time(self.last_active),
        }
        if self.display_name:
            out["displayName"] = self.display_name
        return out


Write = Callable[[], Awaitable[None]]

LEFT = "left"
"""The change an attachment's end is logged as."""


@dataclass(frozen=True, slots=True)
class Change:
    """One change for the loop to write: ``joined``, ``state`` (an entry put) or ``left``."""

    kind: str
    attachment: Attachment


class PresenceBoard:
    """This front's attachments (see the module's docstring)."""

    def __init__(self, settings: Settings, log: SessionLog, store: PresenceStore) -> None:
        self.settings = settings
        self.log = log
        self.store = store
        self.attachments: dict[tuple[str, str], Attachment] = {}
        """By (connection id, session id)."""
        self._changes: asyncio.Queue[Change] = asyncio.Queue(MAX_QUEUED_WRITES)
        self._written = 0.0
        """When the loop last began a write of changes (``time.monotonic()``)."""

    # -- changes, from the connections -------------------------------------------------------

    def joined(self, conn: Attendee, tenant: str, session_id: str) -> Attachment:
        """``conn`` attached to the session (again: the same attachment)."""
        key = (conn.id, session_id)
        found = self.attachments.get(key)
        if found is not None:
            return found
        roles, _ = session_roles(conn.principal, None)  # its ACL's part: when written
        subject = conn.principal.subject if conn.principal is not None else ""
        attachment = Attachment(
            conn.id,
            tenant,
            session_id,
            attachment_id(session_id, conn.id),
            participant_id(session_id, subject),
            roles,
            conn.display_name,
            conn.principal,
        )
        self.attachments[key] = attachment
        self._queue(Change("joined", attachment))
        return attachment

    def left(self, conn_id: str, session_id: str) -> None:
        """The connection's attachment to the session ended (no-op when it has none)."""
        attachment = self.attachments.pop((conn_id, session_id), None)
        if attachment is not None:
            self._queue(Change(LEFT, attachment))

    def touch(self, conn_id: str, session_id: str) -> None:
        """A request on the session from the connection: active now (``online`` again)."""
        attachment = self.attachments.get((conn_id, session_id))
        if attachment is None:
            return
        attachment.last_active = time.time()
        if attachment.state != presence.ONLINE:
            attachment.state = presence.ONLINE
            self._queue(Change("state", attachment))

    async def snapshot(self, tenant: str, session_id: str) -> tuple[int, list[JsonObject]]:
        """The session's presence revision and entries, across every front (lapsed ones
        left out), each as peers see it."""
        read = await self.store.read(tenant, session_id)
        return read.revision, presence.sorted_entries(list(read.entries.values()))

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Write the changes in order; every third of the TTL, refresh, idle and sweep."""
        period = self.settings.presence_ttl / 3
        next_tick = time.monotonic() + period
        while True:
            wait = next_tick - time.monotonic()
            first: Change | None = None
            if wait > 0:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for may swallow the
                # loop's own cancellation when an item arrives in the same step.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        first = await self._changes.get()
            if first is not None:
                since = time.monotonic() - self._written
                if since < GATHER_SECONDS and self._changes.qsize() < BATCH - 1:
                    await asyncio.sleep(GATHER_SECONDS - since)
                self._written = time.monotonic()
                await self._run_write(functools.partial(self._write, self._drained(first)))
                continue
            await self._tick()
            next_tick = time.monotonic() + period

    def _drained(self, first: Change) -> list[Change]:
        """``first`` and every change queued behind it now (at most :data:`BATCH`)."""
        batch = [first]
        while len(batch) < BATCH and not self._changes.empty():
            batch.append(self._changes.get_nowait())
        return batch

    async def _write(self, batch: list[Change]) -> None:
        """The changes in order: each run of entries put between two leavings is written
        per session at once, and logged in one append (a connect storm's joins are a few
        writes, not one a window)."""
        run: list[Change] = []
        for change in batch:
            if change.kind != LEFT:
                run.append(change)
                continue
            await self._put_all(run)
            run = []
            await self._remove(change.attachment)
        await self._put_all(run)

    async def _run_write(self, write: Write) -> None:
        try:
            await write()
        except Exception as exc:  # advisory: a lapse is repaired by the next refresh
            log.warning("presence write failed: %s", exc)

    def _queue(self, change: Change) -> None:
        try:
            self._changes.put_nowait(change)
        except asyncio.QueueFull:
            log.warning("presence writes queue full: a change dropped")

    async def _tick(self) -> None:
        now = time.time()
        idle_after = self.settings.presence_idle_after
        sessions: dict[tuple[str, str], list[Attachment]] = {}
        for attachment in list(self.attachments.values()):
            sessions.setdefault((attachment.tenant, attachment.session_id), []).append(attachment)
            if attachment.state == presence.ONLINE and now - attachment.last_active > idle_after:
                attachment.state = presence.AWAY
                await self._run_write(functools.partial(self._put, attachment, "state"))
        for (tenant, session_id), attachments in sessions.items():
            await self._run_write(functools.partial(self._sweep, tenant, session_id, attachments))

    # -- store and log -----------------------------------------------------------------------

    async def _put(self, attachment: Attachment, change: str) -> None:
        await self._put_all([Change(change, attachment)])

    async def _put_all(self, changes: list[Change]) -> None:
        """Put the entries of ``changes`` (those still attached), one write per session
        whose revision counts each change, and log them in one append."""
        by_session: dict[tuple[str, str], list[Change]] = {}
        for change in changes:
            attachment = change.attachment
            key = (attachment.conn_id, attachment.session_id)
            if change.kind != "joined" and self.attachments.get(key) is not attachment:
                continue  # it left meanwhile: its leaving is written after this
            by_session.setdefault((attachment.tenant, attachment.session_id), []).append(change)
        logged: list[tuple[str, str, JsonObject, str]] = []
        for (tenant, session_id), run in by_session.items():
            await self._with_session_roles(tenant, session_id, run)
            entries = [(c, c.attachment.entry()) for c in run]
            revision = await self.store.put(
                tenant, session_id, {c.attachment.attachment_id: e for c, e in entries}, len(run)
            )
            now = time.monotonic()
            for change in run:
                change.attachment.written = now
            first = revision - len(run) + 1
            made = [(c.kind, first + i, entry) for i, (c, entry) in enumerate(entries)]
            logged.append((tenant, session_id, presence.event_body(made), ""))
        if logged:
            await self._log_all(logged)

    async def _with_session_roles(self, tenant: str, session_id: str, run: list[Change]) -> None:
        """Give the joining attachments of ``run`` their roles on the session, its ACL read
        once for all of them."""
        joining = [
            c.attachment
            for c in run
            if c.kind == "joined"
            and c.attachment.principal is not None
            and tenant_roles(c.attachment.principal) != ALL_ROLES  # else the ACL adds nothing
        ]
        if not joining:
            return
        try:
            snapshot: SessionSnapshot | None = await self.log.snapshot(tenant, session_id)
        except SessionMissing:
            snapshot = None
        for attachment in joining:
            attachment.roles, _ = session_roles(attachment.principal, snapshot)

    async def _remove(self, attachment: Attachment) -> None:
        revision = await self.store.remove(
            attachment.tenant, attachment.session_id, attachment.attachment_id
        )
        if revision is not None:
            entry = attachment.entry()
            await self._logged(attachment.tenant, attachment.session_id, "left", revision, entry)

    async def _sweep(self, tenant: str, session_id: str, attachments: list[Attachment]) -> None:
        # Refreshed: the entries that would lapse before the tick after next (one written in
        # the last third of the TTL lives past it: a connect storm's are not written twice).
        due = time.monotonic() - self.settings.presence_ttl / 3
        live = [
            a
            for a in attachments
            if a.written <= due and self.attachments.get((a.conn_id, a.session_id)) is a
        ]
        if live:
            await self.store.refresh(tenant, session_id, {a.attachment_id: a.entry() for a in live})
            now = time.monotonic()
            for attachment in live:
                attachment.written = now
        read = await self.store.read(tenant, session_id)
        for gone, entry in read.expired.items():
            revision = await self.store.remove(tenant, session_id, gone)
            if revision is not None:  # this front's delete took it: it logs the leaving
                await self._logged(tenant, session_id, "left", revision, entry)

    async def _logged(
        self, tenant: str, session_id: str, change: str, revision: int, entry: JsonObject
    ) -> None:
        body = presence.event_body([(change, revision, entry)])
        await self._log_all([(tenant, session_id, body, "")])

    async def _log_all(self, items: list[tuple[str, str, JsonObject, str]]) -> None:
        """Append presence events, in one round trip. An archived session's presence is in
        its hash only: its log is not brought back to Redis because a window looks at it."""
        for outcome in await self.log.append_many(items, restore=False):
            if isinstance(outcome, Exception) and not isinstance(outcome, SessionArchived):
                log.warning("presence change not logged: %s", outcome)
