"""One Streamable HTTP connection as the front that holds it runs it.

A :class:`HttpLink` is a :class:`~broker.front.acp.connection.ClientConnection` (the
same intake, methods, active sessions and fan-out as a WebSocket's) with no socket: the
messages POSTed to it come from its inbox in the store (:meth:`HttpLink.pump`, in arrival
order, whichever front took the POST), and what it sends goes through an
:class:`~.outbox.HttpOutbox` to its scopes' streams in the store, where the GET streams of
any front read them.

What another front needs to take the connection over is written with what it sends:
the sessions active on it and how far each one's events were sent (one fenced store call,
so the record never says more was sent than the streams hold), and the last inbox entry
taken (before it is taken: a message is taken once, even across a takeover).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from ...auth.principal import Principal
from ...protocol import jsonrpc
from ...protocol.pending import PendingRequests
from ...store.http_links import CONNECTION_SCOPE, HttpLinks
from ..acp.connection import ClientConnection, Dispatcher
from ..acp.lifetime import Lifetime
from .outbox import Emitter, HttpOutbox
from .scopes import id_key, incoming_scope, outgoing_scope

log = logging.getLogger(__name__)


class HttpLink(ClientConnection):
    """The broker's side of one Streamable HTTP connection, on the front that holds it."""

    __slots__ = (
        "_again",
        "_pumping",
        "captured",
        "done",
        "ended",
        "links",
        "node",
        "one_stream",
        "replies",
        "ring",
    )

    def __init__(
        self,
        methods: Dispatcher,
        links: HttpLinks,
        node: str,
        *,
        principal: Principal | None,
        conn_id: str,
        ended: Callable[[HttpLink], None],
        ring: Callable[[str, str, str, list[tuple[int, str]]], None],
        emitter: Emitter,
    ) -> None:
        """``ended``: told when the connection stops running here; ``ring``: told (the
        connection, a scope, its reader, the messages) when a GET stream has news in the
        store; ``emitter``: appends what it sends to the store, with the node's other
        connections'."""
        self.links = links
        self.ring = ring
        self.node = node
        self.ended = ended
        self.replies: dict[str, str] = {}
        """The scope each request in flight is answered on, by :func:`~.scopes.id_key`."""
        self.one_stream = False
        """Everything goes on the connection's one stream (the reliable transport's
        binding), not a stream per session."""
        self.captured: dict[str, asyncio.Future[str]] = {}
        """Responses a caller waits for itself (``initialize``'s), by request id."""
        self.done = "0"
        """The last inbox entry taken."""
        self._pumping = False
        self._again = False
        settings = methods.settings
        loop = asyncio.get_running_loop()

        def outbox(conn_id: str, lifetime: Lifetime) -> HttpOutbox:
            return HttpOutbox(self, emitter, conn_id, settings.max_queue_bytes, loop, lifetime)

        super().__init__(
            None,  # type: ignore[arg-type]  # no socket: see the module's description
            methods,
            principal=principal,
            conn_id=conn_id,
            outbox=outbox,
        )
        # The ids of requests to the client go on from any front that ran the connection
        # before (microseconds since the epoch: larger than any id an earlier one gave out
        # at its pace, and below 2**53, exact in every JSON reader).
        self._pending = PendingRequests(first=time.time_ns() // 1000)

    # -- the outbox's sink ------------------------------------------------------------------

    def route(self, message: Any) -> str | None:
        """See :meth:`~.outbox.Sink.route`."""
        if isinstance(message, dict) and "method" not in message and self.captured:
            waiter = self.captured.pop(id_key(message.get("id")), None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(jsonrpc.encode(message))
                return None
        scope = outgoing_scope(message, self.replies)
        return CONNECTION_SCOPE if self.one_stream else scope

    def fields(self) -> dict[str, str]:
        """See :meth:`~.outbox.Sink.fields`."""
        return {"sessions": json.dumps(self.positions()), "done": self.done}

    def stored(self, written: list[tuple[str, str]], cursors: list[tuple[int, str]]) -> None:
        """See :meth:`~.outbox.Sink.stored`: the GET streams reading them are rung."""
        rings: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for (scope, text), (cursor, reader) in zip(written, cursors, strict=True):
            if reader:
                rings.setdefault((scope, reader), []).append((cursor, text))
        for (scope, reader), stored in rings.items():
            self.ring(self.id, scope, reader, stored)

    def lost(self, reason: str) -> None:
        """See :meth:`~.outbox.Sink.lost`."""
        log.warning("Streamable HTTP connection %s let go here: %s", self.id, reason)
        self.end()

    # -- state ------------------------------------------------------------------------------

    def positions(self) -> dict[str, int]:
        """How far each active session's events were sent, by session id."""
        return {sid: session.delivered for sid, session in self.sessions.active.items()}

    def restore(self, record: dict[str, str]) -> None:
        """Take on what ``initialize`` negotiated, as the record says."""
        version = record.get("v")
        self.protocol_version = int(version) if version else None
        self.client_capabilities = json.loads(record.get("caps") or "{}")
        self.client_instance = record.get("ci") or ""  # its operation ids' scope
        self.done = record.get("done") or "0"
        self.one_stream = record.get("one") == "1"

    async def resume_sessions(self, record: dict[str, str]) -> None:
        """Make the record's sessions active here again, each from where its events were
        last sent (a takeover: what was sent after that, and before this, comes now)."""
        for session_id, delivered in json.loads(record.get("sessions") or "{}").items():
            try:
                await self.activate(
                    self.tenant, session_id, replay_after=int(delivered), replay_now=True
                )
            except jsonrpc.RpcError as exc:  # gone, or its history cut: the client reloads it
                log.info("session %s not resumed on %s: %s", session_id, self.id, exc.message)
                continue
            self.release(session_id)  # no reply to order them after: live events flow now

    # -- the inbox --------------------------------------------------------------------------

    def pump(self) -> None:
        """Take the messages waiting in the inbox (again, if a pump runs already)."""
        if self._pumping:
            self._again = True
            return
        self._pumping = True
        self.spawn(self._pump())

    async def _pump(self) -> None:
        try:
            self._again = True
            while self._again:
                self._again = False
                for entry_id, text, sender in await self.links.inbox(self.id, self.done):
                    self.done = entry_id
                    await self.links.save(self.id, {"done": entry_id})
                    self.principal = credential(self.tenant, sender) or self.principal
                    self.note_request(text)
                    await self.intake.take_frame(text)
                    self._again = True
        except Exception:
            log.exception("the inbox of %s could not be read; it is read at the next POST", self.id)
        finally:
            self._pumping = False

    def note_request(self, text: str) -> None:
        """Remember which scope a request's answer goes to (the session it names, checked
        with the POST's headers by the front that took it)."""
        try:
            message = json.loads(text)
            scope = incoming_scope(message, _named(message))
        except ValueError:
            return
        if scope is not None:
            self.replies[id_key(message["id"])] = scope

    def capture(self, msg_id: Any) -> asyncio.Future[str]:
        """A future for the response to request ``msg_id`` (not sent on any stream)."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.captured[id_key(msg_id)] = future
        return future

    # -- the end ----------------------------------------------------------------------------

    def cut(self, code: int, reason: str) -> None:
        """The credential is no longer good: the connection ends here (see the base class)."""
        self.principal, self.unauthenticated_since = None, None
        self.end()

    def end(self) -> None:
        """Stop running the connection here: leave its sessions, fail what it asked."""
        self.ended(self)
        self.lifetime.spawn(self._leave())

    async def _leave(self) -> None:
        self.outbox.close()
        if self._pending is not None:
            self._pending.fail_all("the connection ended")
        await self.sessions.leave_all()


def sender(principal: Principal) -> str:
    """A POST's credential as its inbox entry keeps it: each message is then served with
    the scopes of who sent it, whichever front runs the connection."""
    roles = None if principal.roles is None else sorted(principal.roles)
    return json.dumps([sorted(principal.scopes), principal.subject, principal.expires, roles])


def credential(tenant: str, sender: str) -> Principal | None:
    """The credential :func:`sender` wrote (None: none was); one written before it kept
    the roles has none named (the defaults)."""
    try:
        scopes, subject, expires, *rest = json.loads(sender)
    except (ValueError, TypeError):
        return None
    roles = rest[0] if rest else None
    return Principal(
        tenant, frozenset(scopes), subject, expires, None if roles is None else frozenset(roles)
    )


def _named(message: Any) -> str | None:
    """The session a message names (its POST's header was checked against it already)."""
    params = message.get("params") if isinstance(message, dict) else None
    session_id = params.get("sessionId") if isinstance(params, dict) else None
    return session_id if isinstance(session_id, str) else None
