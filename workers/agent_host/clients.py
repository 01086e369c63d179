"""Agent-to-client requests, asked through a session's live channel, answered in the inbox.

An agent's request (``session/request_permission``, ``fs/*``, ``terminal/*``) is published on
the session's channel, where every front node with the session active sees it. A node asks
one of its connections and writes the answer, under the request's id (``rid``), to this
host's inbox stream; the first answer wins.

Nothing of the round trip may be lost:

* the waiter is registered *before* the request is published, so an answer that arrives
  before ``SPUBLISH`` returns finds it;
* the request is published again, under the same ``rid``, every ``reask_interval`` seconds
  until it is answered (pub/sub may drop a message; a node's answer may have failed to reach
  the inbox): a node that is still asking its client ignores the repeat, one that already
  answered writes its answer again, so the client is never asked twice;
* a request no front heard (none subscribed: one may be subscribing again after Redis came
  back) is published again for a few seconds before it counts as nobody's;
* after ``timeout`` seconds without an answer the request fails with a clear error, which the
  agent receives as the answer to its request (and which ends the prompt turn for an agent
  that cannot go on without it), never a hang.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from broker.protocol import commands
from broker.protocol.jsonrpc import INTERNAL_ERROR, JsonObject, RpcError
from broker.store.client import Store
from broker.store.errors import StoreError
from broker.store.keys import SessionKeys
from broker.store.live import Publisher
from broker.store.retry import retrying, unheard

log = logging.getLogger(__name__)

UNHEARD_GRACE = 3.0
"""Seconds a request that no front heard is published again before it counts as nobody's:
after Redis comes back, a front's subscriptions are made again within a second or so, and
a request asked meanwhile once failed with "no connected client where the session is
active" where the client was connected all along."""


NOBODY = "no connected client where the session is active can answer"
"""How the failure of a request no connection could answer begins."""


@dataclass(frozen=True, slots=True)
class Answered:
    """A client's answer and who gave it (the answering connection's principal, as its
    front named it; ``""`` when it did not say)."""

    result: Any
    by: str = ""


class NobodyAnswered(Exception):
    """Every node that heard the request said that none of its connections can answer it."""


@dataclass
class _Waiter:
    """One request waiting for its answer: which nodes heard it, which declined."""

    future: asyncio.Future[Answered]
    receivers: int | None = None
    declined: set[str] = field(default_factory=set)
    held: bool = False
    """Whether a client had the question (then went away): it was asked, or a node heard it
    and neither answered nor declined within an interval."""

    def check_declined(self) -> None:
        heard_all = self.receivers is not None and len(self.declined) >= self.receivers
        if heard_all and not self.future.done():
            self.future.set_exception(NobodyAnswered())


class RemoteClients:
    """Agent-to-client requests, through the session's live channel to the front nodes.

    ``timeout`` bounds how long a request waits for its answer (a person may be deciding on
    a permission); ``reask_interval`` is how often an unanswered request is published again.
    """

    def __init__(
        self,
        redis: Store,
        inbox: str,
        *,
        timeout: float = 600.0,
        reask_interval: float = 5.0,
        reconnect_grace: float = 0.0,
        unheard_grace: float = UNHEARD_GRACE,
    ) -> None:
        self.publisher = Publisher(redis)
        self.unheard_grace = unheard_grace
        self.inbox = inbox
        self.timeout = timeout
        self.reask_interval = reask_interval
        self.reconnect_grace = reconnect_grace
        """Seconds a question whose client went away (its node stopped, its connection
        dropped) keeps being asked while no connection can answer it: a client that
        reconnects (the stdio bridge, the console) and resumes the session gets it again.
        A question no connection could ever answer fails at once."""
        self._ids = itertools.count(1)
        self._waiting: dict[str, _Waiter] = {}

    async def request_client(
        self, tenant: str, session_id: str, method: str, params: JsonObject, prefer: str | None
    ) -> Any:
        """The result of :meth:`answer_client`."""
        return (await self.answer_client(tenant, session_id, method, params, prefer)).result

    async def answer_client(
        self, tenant: str, session_id: str, method: str, params: JsonObject, prefer: str | None
    ) -> Answered:
        """Ask the client (``prefer``: that connection first) and return its answer.

        ``prefer`` :data:`~broker.protocol.commands.UNATTENDED_ORIGIN` (a turn a session
        tool started): no connection can answer yet is no refusal; the request is asked
        again every ``reask_interval`` until a window where the session is active (its live
        view, say) answers, or ``timeout`` passes.

        Raises :class:`RpcError` when no connection can answer, or none did in time.
        """
        channel = SessionKeys(tenant, session_id).channel
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        heard: list[bool] = []  # whether a client had it (then went away)
        until = None
        targets = [prefer, None] if prefer else [None]
        while True:
            for target in targets:
                rid = f"{self.inbox}#{next(self._ids)}"
                message = commands.client_request(rid, self.inbox, method, params, target)
                waiter = _Waiter(loop.create_future())
                self._waiting[rid] = waiter  # before publishing: the answer may come first
                try:
                    data = commands.encode(message)
                    # Within the reconnect grace the re-asking is the retry: no longer
                    # than what is left of it for a message nobody heard.
                    patience = self.unheard_grace
                    if until is not None:
                        patience = min(patience, max(0.0, until - loop.time()))
                    return await self._until_answered(
                        channel, data, waiter, method, heard, patience
                    )
                except NobodyAnswered:
                    if waiter.held:
                        heard.append(True)
                    continue
                finally:
                    self._waiting.pop(rid, None)
                    await self._settled(channel, rid)
            now = loop.time()
            if prefer == commands.UNATTENDED_ORIGIN:  # a window may open: until the timeout
                if now >= deadline:
                    break
                wait_until = deadline
            else:  # a client that had it may come back: for the reconnect grace
                if not heard or self.reconnect_grace <= 0:
                    break
                until = until if until is not None else now + self.reconnect_grace
                if now >= until:
                    break
                wait_until = until
                targets = [None]  # whoever resumed the session now
            await asyncio.sleep(min(self.reask_interval, max(0.0, wait_until - now)))
        raise RpcError(INTERNAL_ERROR, f"{NOBODY} {method}")

    async def _until_answered(
        self,
        channel: str,
        data: str,
        waiter: _Waiter,
        method: str,
        heard: list[bool],
        patience: float,
    ) -> Answered:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            try:
                receivers: int = await retrying(
                    lambda: self._publish(channel, data), patience, (), again=unheard
                )
            except (StoreError, OSError) as exc:  # a socket error is the store out of reach too
                # The store is out of reach: the answer cannot come back either. Ask again
                # at the next interval, until the deadline.
                log.warning("asking for %s failed: %s: %s", method, type(exc).__name__, exc)
            else:
                if not receivers and not waiter.future.done():
                    raise NobodyAnswered
                waiter.receivers = receivers
                waiter.check_declined()
            left = deadline - loop.time()
            if left <= 0:
                raise RpcError(
                    INTERNAL_ERROR,
                    f"no client answered {method} within {self.timeout:g} s; the request is "
                    "withdrawn",
                )
            try:
                return await asyncio.wait_for(
                    asyncio.shield(waiter.future), min(self.reask_interval, left)
                )
            except TimeoutError:
                if waiter.receivers:  # a node has it and is asking its client
                    waiter.held = True
                    heard.append(True)
                continue

    async def _publish(self, channel: str, data: str) -> int:
        """``SPUBLISH``: how many subscribers heard it."""
        return await self.publisher.publish(channel, data)

    async def _settled(self, channel: str, rid: str) -> None:
        """Tell the other nodes the request is settled (withdraws it from their clients)."""
        try:
            await self.publisher.publish(channel, commands.encode(commands.client_settled(rid)))
        except (StoreError, OSError) as exc:  # raised here, it would replace the answer
            # Not an answer: a node that misses it withdraws the request when its own
            # client's answer reaches a host that no longer waits for it.
            log.info("could not announce that %s is settled: %s", rid, exc)

    def on_reply(self, message: JsonObject) -> None:
        """A front node's answer: a result, an error, or "no connection of mine can"."""
        waiter = self._waiting.get(str(message.get("rid")))
        if waiter is None or waiter.future.done():
            return
        if message.get("none"):
            waiter.held = waiter.held or bool(message.get("asked"))
            waiter.declined.add(str(message.get("node")))
            waiter.check_declined()
        elif "error" in message:
            waiter.future.set_exception(commands.rpc_error(message["error"]))
        else:
            waiter.future.set_result(Answered(message.get("result"), str(message.get("by") or "")))

    def waiting(self) -> int:
        """How many requests wait for an answer now."""
        return len(self._waiting)
