"""A front's side of the Streamable HTTP connections: which it runs, and how any request of
any connection reaches the one front that runs it.

No front is sticky. A POST on any front is queued in the connection's inbox in the store,
then served: by this front when it holds the connection (or takes it, free), else by its
holder, rung on its node channel. A holder that died (its lease lapses after
``http_lease``) is replaced by the next front that takes a request of the connection: it
takes the record's state (:meth:`~.link.HttpLink.restore`), makes its sessions active again
from where their events were last sent, and takes the inbox from the last entry taken.
A front that rang a holder watches, bounded, that its message is taken, and takes the
connection over itself when the holder is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

from ...auth.principal import Principal
from ...config import Settings
from ...store.http_links import HttpLinks
from ..acp.access import Access
from ..acp.connection import Dispatcher
from ..routing import HTTP_BELL
from .bell import Bell
from .link import HttpLink, sender
from .outbox import Emitter

log = logging.getLogger(__name__)


class ConnectionRefused(Exception):
    """A new connection over this node's or its credential's cap (HTTP 429)."""


def _entry(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


class StreamableHttp:
    """The Streamable HTTP connections of one front (``node``: its node id)."""

    def __init__(
        self, settings: Settings, methods: Dispatcher, links: HttpLinks, node: str, access: Access
    ) -> None:
        self.settings = settings
        self.methods = methods
        self.access = access
        """The node's connection counts: a connection run here holds a place."""
        self.links = links
        self.node = node
        self.here: dict[str, HttpLink] = {}
        """The connections this front runs, by id."""
        self.bells: dict[tuple[str, str], Bell] = {}
        """The GET streams open here, by (connection, scope): set when news is stored."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self.emitter = Emitter(links, node)
        """What the connections run here send, gathered per step into one store call."""
        self.stopping = False
        """The front stops: its GET streams end (their clients reconnect elsewhere)."""

    # -- life -------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Let every connection go (another front takes each at its next request)."""
        self.stopping = True
        for link in list(self.here.values()):
            link.end()
            # Stopping: a lease not released lapses within http_lease, then any front takes
            # the connection over; nothing of the client's is held only here.
            with contextlib.suppress(Exception):
                await self.links.release(link.id, self.node)
        for task in list(self._tasks):
            task.cancel()
        for bell in self.bells.values():
            bell.ring()

    async def renew(self) -> None:
        """Renew the leases of the connections held here, a third of a lease apart, until
        cancelled (a loop of the front's :class:`~broker.lifetimes.RoleLoops`, stopped
        before :meth:`stop`)."""
        period = self.settings.http_lease / 3
        while True:
            await asyncio.sleep(period)
            for conn_id, link in list(self.here.items()):
                try:
                    held = await self.links.renew(conn_id, self.node)
                except Exception as exc:  # the store is away: try again next round
                    log.warning("could not renew Streamable HTTP connection %s: %s", conn_id, exc)
                    continue
                if not held:
                    link.end()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- connections ------------------------------------------------------------------------

    def _make(self, conn_id: str, principal: Principal | None) -> HttpLink:
        link = HttpLink(
            self.methods,
            self.links,
            self.node,
            principal=principal,
            conn_id=conn_id,
            ended=self._ended,
            ring=self.ring,
            emitter=self.emitter,
        )
        self.here[conn_id] = link
        return link

    def _ended(self, link: HttpLink) -> None:
        if self.here.get(link.id) is link:
            del self.here[link.id]
            self.access.close_connection(link.id)

    async def initialize(
        self, principal: Principal, msg_id: Any, text: str, *, one_stream: bool = False
    ) -> tuple[str, str]:
        """Open a connection with its ``initialize`` request: its id and the response.
        ``one_stream``: everything it sends goes on the connection's stream."""
        conn_id = uuid.uuid4().hex
        refusal = self.access.open_connection(conn_id, principal)
        if refusal is not None:
            raise ConnectionRefused(refusal)
        await self.links.create(
            conn_id,
            {"tenant": principal.tenant, "subject": principal.subject, "at": str(time.time())},
        )
        await self.links.claim(conn_id, self.node)
        link = self._make(conn_id, principal)
        link.one_stream = one_stream
        answer = link.capture(msg_id)
        try:
            await link.intake.take_frame(text)
            response = await asyncio.wait_for(answer, self.settings.request_timeout)
        except BaseException:
            link.end()
            await self.links.delete(conn_id)
            raise
        if link.protocol_version is None:  # refused: no connection was made
            link.end()
            await self.links.delete(conn_id)
            return "", response
        caps = json.dumps(link.client_capabilities)
        fields = {"v": str(link.protocol_version), "caps": caps, "ci": link.client_instance}
        if one_stream:
            fields["one"] = "1"
        await self.links.save(conn_id, fields)
        return conn_id, response

    async def post(self, conn_id: str, principal: Principal, text: str) -> None:
        """Queue a message for the connection and see that its holder takes it."""
        await self.links.touch(conn_id)
        entry = await self.links.push(conn_id, text, sender(principal))
        await self._serve(conn_id, principal, entry)

    async def _serve(self, conn_id: str, principal: Principal, entry: str) -> None:
        link = self.here.get(conn_id)
        if link is not None:
            link.pump()
            return
        for _ in range(3):
            holder = await self.links.claim(conn_id, self.node)
            if holder == self.node:
                await self._take(conn_id, principal)
                return
            if holder is not None:
                await self.links.ring(holder, {HTTP_BELL: "in", "c": conn_id})
                self._spawn(self._watch(conn_id, principal, entry))
                return

    async def ensure_held(self, conn_id: str, principal: Principal) -> None:
        """Take the connection over when nobody runs it (its holder crashed): what its
        sessions' agents ask meanwhile then reaches its streams, with no POST to wake it."""
        if conn_id not in self.here and await self.links.claim(conn_id, self.node) == self.node:
            await self._take(conn_id, principal)

    async def _take(self, conn_id: str, principal: Principal) -> None:
        """Run the connection here from now on (it was free, or its holder's lease lapsed)."""
        record = await self.links.load(conn_id)
        if record is None:
            await self.links.release(conn_id, self.node)
            return
        self.access.open_connection(conn_id, principal)  # counted even past the cap: taken over
        link = self._make(conn_id, principal)
        link.restore(record)
        await link.resume_sessions(record)
        link.pump()

    async def _watch(self, conn_id: str, principal: Principal, entry: str) -> None:
        """See, bounded, that the holder takes message ``entry``; take the connection over
        when the holder is gone (its lease lapsed)."""
        step = self.settings.http_lease / 4
        for _ in range(16):
            await asyncio.sleep(step)
            record = await self.links.load(conn_id)
            if record is None or _entry(record.get("done") or "0") >= _entry(entry):
                return
            if conn_id in self.here:
                self.here[conn_id].pump()
                return
            if await self.links.claim(conn_id, self.node) == self.node:
                await self._take(conn_id, principal)
                return
        log.warning("message %s of connection %s was not taken in time", entry, conn_id)

    async def delete(self, conn_id: str) -> None:
        """End the connection (its sessions live on)."""
        link = self.here.get(conn_id)
        if link is not None:
            link.end()
        else:
            record = await self.links.load(conn_id)
            holder = await self.links.claim(conn_id, self.node) if record is not None else None
            if holder is not None and holder != self.node:
                await self.links.ring(holder, {HTTP_BELL: "end", "c": conn_id})
        await self.links.delete(conn_id)
        for (conn, _), bell in list(self.bells.items()):
            if conn == conn_id:
                bell.ring()

    # -- bells ------------------------------------------------------------------------------

    def on_bell(self, message: dict[str, Any]) -> None:
        """A node message about a connection: news in its inbox, its streams, or its end."""
        kind, conn_id = message.get(HTTP_BELL), str(message.get("c"))
        link = self.here.get(conn_id)
        if kind == "in" and link is not None:
            link.pump()
        elif kind == "end" and link is not None:
            link.end()
        elif kind == "out":
            bell = self.bells.get((conn_id, str(message.get("s"))))
            if bell is not None:
                bell.ring()

    def ring(self, conn_id: str, scope: str, reader: str, stored: list[tuple[int, str]]) -> None:
        """``stored`` messages of ``scope`` are in the store: ring its GET stream, here
        (handing them along) or on its node."""
        node = reader.split("|", 1)[0]
        if node == self.node:
            bell = self.bells.get((conn_id, scope))
            if bell is not None:
                bell.ring(stored)
            return
        self._spawn(self.links.ring(node, {HTTP_BELL: "out", "c": conn_id, "s": scope}))
