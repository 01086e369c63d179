"""What reaches a front node from the agent side, and where it goes.

Replies to this node's commands go to the :class:`~.agents.RemoteAgents`.
Agent-to-client requests arrive on a session's channel, on every node where
the session is active: this node asks one of its connections — the one that
sent the running prompt when it is here, else (when no preference is given)
any connection that can answer — and sends the answer to the agent host. The
host takes the first answer and tells the other nodes the request is settled,
which withdraws it from their clients (``$/cancel_request``).

A connection that said at ``initialize`` that it shows every permission request
(``capabilities._meta["acpBroker/sharedAsks"]: true``, as the web console does) is
asked too, at the same time as the one above: a request shows in every such window,
the first answer from any of them wins, and the others are withdrawn.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..auth.principal import Scope
from ..errors.failures import describe
from ..protocol import capabilities, commands
from ..protocol.commands import SessionMessage
from ..protocol.jsonrpc import INTERNAL_ERROR, JsonObject, RpcError
from ..store.bus import CommandBus
from ..store.client import Store
from ..store.errors import StoreError
from ..store.events import LogEvent
from ..store.keys import SessionKeys
from ..store.retry import retrying
from .acp.connection import ClientConnection
from .agents import RemoteAgents
from .approval import may_answer
from .fanout import FanoutHub, HubListener
from .session_acl import SessionAcl

log = logging.getLogger(__name__)

ANSWERS_KEPT = 10_000
"""Answers a node remembers, for hosts that ask again (a few hundred bytes each)."""

# Which client capability a request needs: (capability path) per method prefix.
_NEEDS: dict[str, tuple[str, ...]] = {
    "fs/read_text_file": ("fs", "readTextFile"),
    "fs/write_text_file": ("fs", "writeTextFile"),
    "terminal/": ("terminal",),
}


HTTP_BELL = "acpHttp"
"""The key of a node message about a Streamable HTTP connection (see ``streamable``)."""

APPROVALS = frozenset({"session/request_permission", "elicitation/create"})
"""The agent's requests a person answers: asked only of connections whose roles on the
session give ``session.approve``."""
SHARED_ASKS_META = "acpBroker/sharedAsks"
SHARED_ASKS = frozenset({"session/request_permission"})
"""Requests that every connection sharing asks is shown, beside the preferred one."""


def shares_asks(conn: ClientConnection) -> bool:
    """Whether the connection asked to be shown every permission request of its sessions."""
    return capabilities.opted_in(conn.client_capabilities, SHARED_ASKS_META)


def can_answer(conn: ClientConnection, method: str) -> bool:
    """Whether the connection may answer ``method`` for the agent: its credential has the
    write scope (an answer to an agent acts on the session: a read-only viewer is never
    asked), and its client said at initialize that it handles ``method``."""
    if not may_act(conn):
        return False
    for prefix, path in _NEEDS.items():
        if method.startswith(prefix):
            value: Any = conn.client_capabilities
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            return bool(value)
    return True


def may_act(conn: ClientConnection) -> bool:
    """Whether the connection's credential has the write scope now."""
    return conn.principal is not None and conn.principal.may(Scope.WRITE)


class NodeRouter(HubListener):
    """Routes replies to the gateway and agent requests to this node's connections."""

    def __init__(
        self, redis: Store, hub: FanoutHub, agents: RemoteAgents, *, answer_timeout: float = 30.0
    ) -> None:
        self.bus = CommandBus(redis)
        self.hub = hub
        self.acl = SessionAcl(hub.log)
        """Who may answer a question of the agent's (``approval.may_answer``)."""
        self.agents = agents
        self.answer_timeout = answer_timeout
        self.http_bells: Callable[[dict[str, Any]], None] | None = None
        """Where node messages about Streamable HTTP connections go (the node sets it)."""
        self._asking: dict[str, asyncio.Task[Any]] = {}
        # The answers given lately, by request id: a host that asks again (it never got the
        # answer) gets the same answer, and the person is not asked twice.
        self._answered: OrderedDict[str, JsonObject] = OrderedDict()
        self._sending: set[asyncio.Task[None]] = set()

    def on_node_message(self, message: dict[str, Any]) -> None:
        if HTTP_BELL in message:
            if self.http_bells is not None:
                self.http_bells(message)
            return
        self.agents.on_reply(message)

    def on_event(self, event: LogEvent) -> None:
        self.agents.on_event(event)

    def on_session_message(self, keys: SessionKeys, message: dict[str, Any]) -> None:
        kind, rid = message.get("kind"), str(message.get("rid"))
        if kind == SessionMessage.CLIENT_REQUEST:
            if rid in self._asking:
                return  # asked again while this node's client is still deciding
            if rid in self._answered:
                self._spawn_answer(message, self._answered[rid])
                return
            task = asyncio.ensure_future(self._ask(keys, message))
            self._asking[rid] = task
            task.add_done_callback(lambda done: self._asked(rid, done))
        elif kind == SessionMessage.CLIENT_SETTLED:
            self._answered.pop(rid, None)
            if rid in self._asking:
                self._asking[rid].cancel()

    def _asked(self, rid: str, task: asyncio.Task[Any]) -> None:
        """An ask ended: forgotten, and a failure even answering it logged (not left in a
        task nobody reads)."""
        self._asking.pop(rid, None)
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            log.error("could not answer agent request %s: %s", rid, describe(failure))

    async def _ask(self, keys: SessionKeys, message: JsonObject) -> None:
        """Ask a client and hand its answer to the agent host. A fault in asking is logged in
        a line and the agent answered with an error at once (it once ended the task unread:
        the host asked again and again until ``client_request_timeout``)."""
        try:
            answer = await self._client_answer(keys, message)
        except Exception as exc:
            log.error(
                "asking a client for agent request %s failed: %s", message.get("rid"), describe(exc)
            )
            failure = RpcError(INTERNAL_ERROR, f"asking the client failed: {describe(exc)}")
            answer = {"error": failure.to_json()}
        await self._answer(message, answer)

    async def _client_answer(self, keys: SessionKeys, message: JsonObject) -> JsonObject:
        """The answer of this node's clients (``{"none": True}``: none of them can)."""
        method, prefer = str(message["method"]), message.get("prefer")
        candidates = [
            conn
            for conn in self.hub.subscribers(keys.session_id, keys.tenant)
            if isinstance(conn, ClientConnection) and can_answer(conn, method)
        ]
        if method in APPROVALS:  # a question for a person: an approver's or an owner's
            allowed = [
                conn
                for conn in candidates
                if await may_answer(self.acl, conn.principal, keys.session_id)
            ]
            if any(conn.id == prefer for conn in candidates if conn not in allowed):
                prefer = None  # its prompter may not answer: those here who may are asked
            candidates = allowed
        shared = method in SHARED_ASKS
        sharing = [conn for conn in candidates if shared and shares_asks(conn)]
        if prefer is not None:
            candidates = [conn for conn in candidates if conn.id == prefer]
        answer: JsonObject = {"none": True}
        # The preferred connection (or, with none, each in turn until one can), and beside it
        # every connection that shares asks; only those when no other is here.
        rounds = [[conn, *(c for c in sharing if c is not conn)] for conn in candidates]
        for conns in rounds or ([sharing] if sharing else []):
            try:
                answer = await self._first_answer(conns, method, message["params"])
                break
            except ConnectionError:
                # Asked, and gone before answering (its node stops, its link dropped): the
                # host waits a while for the client to come back (client_reconnect_grace).
                answer = {"none": True, "asked": True}
                continue
        return answer

    async def _first_answer(
        self, conns: list[ClientConnection], method: str, params: JsonObject
    ) -> JsonObject:
        """Ask every connection at once; the first answer wins and the others are withdrawn.

        Raises :class:`ConnectionError` when none of them can answer (all gone; an answer
        from one that lost the write scope meanwhile is not taken).
        """

        async def asked(conn: ClientConnection) -> tuple[ClientConnection, Any]:
            return conn, await conn.request_client(method, params)

        asks = [asyncio.ensure_future(asked(conn)) for conn in conns]
        try:
            for next_answer in asyncio.as_completed(asks):
                try:
                    conn, result = await next_answer
                except RpcError as exc:
                    return {"error": exc.to_json()}
                except ConnectionError:
                    continue
                if not may_act(conn):  # it lost the write scope (logged out) while asked
                    log.info("refused the answer of %s: no write scope", conn.id)
                    continue
                # Who answered: the host records it on the interaction (as a participant id).
                by = conn.principal.subject if conn.principal is not None else ""
                return {"result": result, "by": by}
            raise ConnectionError(f"no connection left to answer {method}")
        finally:
            for ask in asks:
                ask.cancel()  # a pending ask is withdrawn from its client ($/cancel_request)
            await asyncio.wait(asks)

    def _spawn_answer(self, message: JsonObject, answer: JsonObject) -> None:
        task = asyncio.ensure_future(self._answer(message, answer))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _answer(self, message: JsonObject, answer: JsonObject) -> None:
        """Hand the answer to the agent host, trying again while Redis is out of reach.

        The same request id each time: the host takes the first copy. An answer that still
        cannot be written is logged; the host, hearing none, asks again and gets it from
        :attr:`_answered`."""
        rid = str(message["rid"])
        if not answer.get("none"):  # a decline is not kept: a connection may come meanwhile
            self._answered[rid] = answer
            while len(self._answered) > ANSWERS_KEPT:
                self._answered.popitem(last=False)
        data = commands.encode(commands.client_reply(rid, self.hub.node_id, answer))
        inbox = str(message["reply"])
        try:
            await retrying(
                lambda: self.bus.send(inbox, data),
                self.answer_timeout,
            )
        except (StoreError, OSError) as exc:
            log.error(
                "could not hand the answer to %s to its agent host: %s: %s",
                rid,
                type(exc).__name__,
                exc,
            )
