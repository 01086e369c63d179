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
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ..auth.principal import Principal
from ..auth.roles import AclEntry, effective, permissions_of
from ..config import Settings
from ..protocol import presence
from ..protocol.interactions import attachment_id, participant_id
from ..protocol.jsonrpc import JsonObject
from ..store.log import SessionLog
from ..store.presence import PresenceStore

log = logging.getLogger(__name__)

MAX_QUEUED_WRITES = 10_000
"""Presence writes a front keeps waiting for the store; past it new ones are dropped (a
store away for long: entries then lapse and come back with the next refresh)."""


class Attendee(Protocol):
    """What presence reads of a connection."""

    id: str
    principal: Principal | None
    display_name: str | None


def session_roles(
    principal: Principal | None, session_id: str, entries: Iterable[AclEntry] = ()
) -> tuple[list[str], list[str]]:
    """The roles ``principal`` holds on the session and the permissions they grant (sorted
    names): its credential's tenant roles (those a token or JWT names, else the defaults)
    and what its live entries among ``entries`` (the session's ACL) give it, by the rule
    that authorizes (``auth.roles.effective``)."""
    if principal is None:
        return [], []
    roles = effective(entries, principal, time.time())
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
    state: str = presence.ONLINE
    last_active: float = field(default_factory=time.time)

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


class PresenceBoard:
    """This front's attachments (see the module's docstring)."""

    def __init__(self, settings: Settings, log: SessionLog, store: PresenceStore) -> None:
        self.settings = settings
        self.log = log
        self.store = store
        self.attachments: dict[tuple[str, str], Attachment] = {}
        """By (connection id, session id)."""
        self._writes: asyncio.Queue[Write] = asyncio.Queue(MAX_QUEUED_WRITES)

    # -- changes, from the connections -------------------------------------------------------

    def joined(self, conn: Attendee, tenant: str, session_id: str) -> Attachment:
        """``conn`` attached to the session (again: the same attachment)."""
        key = (conn.id, session_id)
        found = self.attachments.get(key)
        if found is not None:
            return found
        roles, _ = session_roles(conn.principal, session_id)
        subject = conn.principal.subject if conn.principal is not None else ""
        attachment = Attachment(
            conn.id,
            tenant,
            session_id,
            attachment_id(session_id, conn.id),
            participant_id(session_id, subject),
            roles,
            conn.display_name,
        )
        self.attachments[key] = attachment
        self._queue(lambda: self._put(attachment, "joined"))
        return attachment

    def left(self, conn_id: str, session_id: str) -> None:
        """The connection's attachment to the session ended (no-op when it has none)."""
        attachment = self.attachments.pop((conn_id, session_id), None)
        if attachment is not None:
            self._queue(lambda: self._remove(attachment))

    def touch(self, conn_id: str, session_id: str) -> None:
        """A request on the session from the connection: active now (``online`` again)."""
        attachment = self.attachments.get((conn_id, session_id))
        if attachment is None:
            return
        attachment.last_active = time.time()
        if attachment.state != presence.ONLINE:
            attachment.state = presence.ONLINE
            self._queue(lambda: self._put(attachment, "state"))

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
            write: Write | None = None
            if wait > 0:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for may swallow the
                # loop's own cancellation when an item arrives in the same step.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        write = await self._writes.get()
            if write is not None:
                await self._run_write(write)
                continue
            await self._tick()
            next_tick = time.monotonic() + period

    async def _run_write(self, write: Write) -> None:
        try:
            await write()
        except Exception as exc:  # advisory: a lapse is repaired by the next refresh
            log.warning("presence write failed: %s", exc)

    def _queue(self, write: Write) -> None:
        try:
            self._writes.put_nowait(write)
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
        key = (attachment.conn_id, attachment.session_id)
        if change != "joined" and self.attachments.get(key) is None:
            return  # it left meanwhile: its leaving is queued after this
        entry = attachment.entry()
        revision = await self.store.put(
            attachment.tenant, attachment.session_id, {attachment.attachment_id: entry}
        )
        await self._logged(attachment.tenant, attachment.session_id, change, revision, entry)

    async def _remove(self, attachment: Attachment) -> None:
        revision = await self.store.remove(
            attachment.tenant, attachment.session_id, attachment.attachment_id
        )
        if revision is not None:
            entry = attachment.entry()
            await self._logged(attachment.tenant, attachment.session_id, "left", revision, entry)

    async def _sweep(self, tenant: str, session_id: str, attachments: list[Attachment]) -> None:
        live = [a for a in attachments if self.attachments.get((a.conn_id, a.session_id)) is a]
        if live:
            await self.store.refresh(tenant, session_id, {a.attachment_id: a.entry() for a in live})
        read = await self.store.read(tenant, session_id)
        for gone, entry in read.expired.items():
            revision = await self.store.remove(tenant, session_id, gone)
            if revision is not None:  # this front's delete took it: it logs the leaving
                await self._logged(tenant, session_id, "left", revision, entry)

    async def _logged(
        self, tenant: str, session_id: str, change: str, revision: int, entry: JsonObject
    ) -> None:
        await self.log.append(tenant, session_id, presence.event_body(change, revision, entry))
