"""How a front node reaches the agent hosts: commands through Redis, replies back.

A command for a session goes to the inbox stream of the host holding the
session's lease, or, when no host holds it (and for new sessions), to the
queue every host reads. The host acknowledges at once and answers on this
node's shard channel. A command that is not acknowledged in time is routed
again (its host may have died: once the lease lapses the queue takes it), and
a host that no longer holds the session says where it went.

A prompt's outcome is also visible in the log: when a host dies mid-turn, the
host that takes the session over ends the prompt with an error event, and the
waiting request completes from that event. A command a host acknowledged and died
before answering (a prompt it had not yet recorded, an attach, a cancel, a mode
change: those a host may run twice to the same effect) is sent again once that host
no longer holds the session (see :meth:`RemoteAgents._watch`); a new session or a
fork is not, and fails at its request's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from ..auth.principal import Principal
from ..auth.roles import Authority
from ..config import AgentSpec
from ..protocol import capabilities, commands
from ..protocol.commands import AgentGateway, Op, PromptOutcome, Reply
from ..protocol.jsonrpc import INTERNAL_ERROR, JsonObject, RpcError, invalid_params
from ..store import hosts
from ..store.bus import CommandBus
from ..store.client import Store
from ..store.errors import StoreError
from ..store.events import EventType, LogEvent
from ..store.keys import host_inbox, host_queue
from ..store.leases import held_or_due
from ..store.log import SessionLog, SessionMissing

log = logging.getLogger(__name__)


HOLDER_GAP_PAUSE = 0.2
"""Seconds between looks for a session's holder while its lease key is missing but it is
still listed as held (a renewal comes every third of the lease's time)."""


class RemoteAgents(AgentGateway):
    """The agent side as seen from a front node: hosts reached through Redis."""

    def __init__(
        self,
        redis: Store,
        agents: list[AgentSpec],
        *,
        reply_channel: str,
        ack_timeout: float = 2.0,
        route_deadline: float = 30.0,
    ) -> None:
        self.redis = redis
        self.bus = CommandBus(redis)
        self.specs = {spec.name: spec for spec in agents}
        self.default_agent = agents[0].name
        self.reply_channel = reply_channel
        self.ack_timeout = ack_timeout
        self.route_deadline = route_deadline
        self._ids = itertools.count(1)
        self._calls: dict[str, _Call] = {}
        self._prompts: dict[str, asyncio.Future[LogEvent]] = {}
        self._started: dict[str, asyncio.Future[None]] = {}  # by prompt id: its prompt event
        self._capabilities: JsonObject = {}
        self._capabilities_read = 0.0
        self._combined: JsonObject | None = None  # what _capabilities adds up to, made once
        self._attaching: dict[tuple[str, str], _Flight] = {}

    # -- what the front knows from configuration ----------------------------------------------

    def kind_of(self, agent: str) -> str:
        spec = self.specs.get(agent)
        if spec is None:
            raise invalid_params(f"unknown agent {agent!r}; configured: {', '.join(self.specs)}")
        return spec.kind

    def agent_capabilities(self) -> JsonObject:
        """What every configured agent advertised (see :func:`capabilities.combined`).

        Worked out once per change of what the hosts published, not once per ``initialize``
        (a node's clients reconnecting elsewhere at once make thousands a second); the
        same object is returned until then, so callers may cache what they derive from it
        by its identity. Callers must not change it."""
        combined = self._combined
        if combined is None:
            combined = self._combined = capabilities.combined(self.specs, self._capabilities)
        return combined

    async def refresh_capabilities(self) -> None:
        """Read what the hosts' agents advertised: cached 30 s once every agent's is known,
        1 s while some agent has not started (so a burst of connections reads it once)."""
        if self.capabilities_fresh():
            return
        raw = await hosts.capabilities(self.redis)
        read = {name: json.loads(value) for name, value in raw.items()}
        if read != self._capabilities:
            self._capabilities, self._combined = read, None
        self._capabilities_read = time.monotonic()

    def capabilities_fresh(self) -> bool:
        """Whether what was read is recent enough (:meth:`refresh_capabilities`: no read)."""
        known = all(name in self._capabilities for name in self.specs)
        return time.monotonic() - self._capabilities_read < (30 if known else 1)

    # -- commands -----------------------------------------------------------------------------

    async def new_session(
        self,
        tenant: str,
        params: JsonObject,
        *,
        agent: str,
        kind: str,
        meta: JsonObject,
        origin: str,
    ) -> tuple[str, JsonObject]:
        self.kind_of(agent)
        reply = await self._call(
            Op.NEW,
            tenant,
            None,
            {"params": params, "agent": agent, "kind": kind, "meta": meta, "origin": origin},
        )
        return str(reply["sessionId"]), dict(reply["reply"])

    async def fork(
        self, tenant: str, parent_id: str, params: JsonObject, *, meta: JsonObject, origin: str
    ) -> tuple[str, JsonObject, int]:
        """Fork a session on the host holding it: (new id, agent's reply, last copied seq)."""
        fields = {"params": params, "meta": meta, "origin": origin}
        reply = await self._call(Op.FORK, tenant, parent_id, fields)
        return str(reply["sessionId"]), dict(reply["reply"]), int(reply["copied"])

    async def attach(
        self, tenant: str, session_id: str, params: JsonObject, *, holder: str | None = None
    ) -> JsonObject:
        """Have an agent hold the session (load, resume); the agent's reply when this call
        brought it back, else ``{}``.

        When a node's clients reconnect here at once, each of a session's clients asks
        within milliseconds of the others: one command goes to the host for all of them
        that ask alike (same params) while it is in flight, and each waits for it as it
        would for its own (the host answers all but the one that restored the session
        ``{}`` anyway). The command runs in a task of its own, so a client that goes away
        does not cancel the others' wait. ``holder``: the host the lease named (read with
        the snapshot), asked first without reading the lease again."""
        key = (tenant, session_id)
        flight = self._attaching.get(key)
        first = flight is None or flight.params != params
        if flight is None or first:
            stream = host_inbox(holder) if holder else None
            call = self._answered(Op.ATTACH, tenant, session_id, {"params": params}, first=stream)
            flight = _Flight(params, asyncio.ensure_future(call))
            self._attaching[key] = flight
            flight.task.add_done_callback(lambda _: self._landed(key, flight))
        reply = await asyncio.shield(flight.task)
        return dict(reply) if first else {}

    def _landed(self, key: tuple[str, str], flight: _Flight) -> None:
        if self._attaching.get(key) is flight:
            del self._attaching[key]
        if not flight.task.cancelled():
            flight.task.exception()  # retrieved: each waiter got it

    async def prompt(
        self,
        tenant: str,
        session_id: str,
        params: JsonObject,
        origin: str,
        prompt_id: str | None = None,
        author: Principal | None = None,
    ) -> PromptOutcome:
        """Run a turn; ``prompt_id`` (default: a fresh one) names its ``prompt`` event;
        ``author``: the principal who alone may withdraw it while it is queued, and whose
        roles and scopes (as now: ``Authority``) must still allow it when its turn comes.

        The turn ends with its host's reply, or with the ``prompt_end`` event the host that
        took the session over wrote (its first host died mid-turn)."""
        prompt_id = prompt_id or secrets.token_hex(8)
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[LogEvent] = loop.create_future()
        self._prompts[prompt_id] = ended
        self._started[prompt_id] = loop.create_future()
        fields: JsonObject = {"params": params, "origin": origin, "promptId": prompt_id}
        if author is not None:
            fields["author"] = author.subject
            fields["authority"] = Authority.of(author).to_json()
        sending = asyncio.ensure_future(self._answered(Op.PROMPT, tenant, session_id, fields))
        try:
            done, _ = await asyncio.wait({sending, ended}, return_when=asyncio.FIRST_COMPLETED)
            if sending in done:
                return commands.prompt_outcome(sending.result())
            return commands.outcome_from_event(ended.result())
        finally:
            sending.cancel()
            self._prompts.pop(prompt_id, None)
            self._started.pop(prompt_id, None)

    async def cancel(
        self, tenant: str, session_id: str, activity_id: str | None = None, origin: str = ""
    ) -> None:
        """Cancel the running turn; ``activity_id``: only that prompt's (one still queued
        is withdrawn, one that ended is a logged no-op)."""
        fields = {} if activity_id is None else {"activityId": activity_id, "origin": origin}
        await self._answered(Op.CANCEL, tenant, session_id, fields, holder_only=True)

    async def close(self, tenant: str, session_id: str, origin: str) -> None:
        await self._answered(Op.CLOSE, tenant, session_id, {"origin": origin}, holder_only=True)

    async def forward(self, tenant: str, session_id: str, method: str, params: JsonObject) -> Any:
        return await self._answered(
            Op.FORWARD, tenant, session_id, {"method": method, "params": params}
        )

    async def interact(
        self,
        tenant: str,
        session_id: str,
        action: str,
        params: JsonObject,
        principal: str,
        authority: Authority | None = None,
    ) -> JsonObject:
        """The holding host's answer; ``{}`` when no host holds the session (nothing is
        pending). A lease key missing while the session is still listed as held (a late
        renewal, a takeover under way) is waited out, within the routing deadline: answered
        "nothing" then, a pending question looked answered, or a claim looked lost. With no
        agent host alive (its host died and no other is left to take the session over)
        nobody holds it nor will: ``{}`` at once, not a command sent to a dead host's inbox
        and waited on until the deadline."""
        fields: JsonObject = {"action": action, "params": params, "principal": principal}
        if authority is not None:
            fields["authority"] = authority.to_json()
        deadline = time.monotonic() + self.route_deadline
        while await hosts.any_alive(self.redis):
            reply = await self._answered(Op.INTERACT, tenant, session_id, fields, holder_only=True)
            if reply or time.monotonic() > deadline:
                return reply if isinstance(reply, dict) else {}
            if not await held_or_due(self.redis, tenant, session_id):
                return {}
            await asyncio.sleep(HOLDER_GAP_PAUSE)
        return {}

    async def fence(self, tenant: str, session_id: str) -> None:
        """The revoke is done whatever happens here: a claim its host could not be told to
        fence still ends at its expiry, so a failure is logged, not raised."""
        try:
            await self._answered(Op.FENCE, tenant, session_id, {}, holder_only=True)
        except (RpcError, StoreError) as exc:
            log.warning("could not fence the claims of session %s: %s", session_id, exc)

    async def release(self, tenant: str, session_id: str) -> None:
        await self._answered(Op.RELEASE, tenant, session_id, {}, holder_only=True)

    async def stop(self, tenant: str, session_id: str) -> None:
        await self._answered(Op.STOP, tenant, session_id, {}, holder_only=True)

    # -- events from the hub ------------------------------------------------------------------

    def on_reply(self, message: JsonObject) -> None:
        """A message on this node's channel: an acknowledgement or a reply."""
        call = self._calls.get(str(message.get("rid")))
        if call is not None:
            call.receive(message)

    def on_event(self, event: LogEvent) -> None:
        """Every event this node sees: a waiting prompt's ``prompt`` event shows it began,
        its ``prompt_end`` completes it."""
        kind = event.type
        if kind == EventType.PROMPT_END:
            _settle(self._prompts.get(str(event.body.get("promptId"))), event)
        elif kind == EventType.PROMPT:
            _settle(self._started.get(str(event.body.get("promptId"))), None)

    # -- routing ------------------------------------------------------------------------------

    async def _answered(
        self,
        op: Op,
        tenant: str,
        session_id: str,
        fields: JsonObject,
        *,
        holder_only: bool = False,
        first: str | None = None,
    ) -> Any:
        """:meth:`_call` for a command about a session that its host may run twice to the
        same effect (or a prompt not yet begun): sent again, as a new call, when the host
        that acknowledged it died before answering (see :meth:`_watch`)."""
        while True:
            try:
                return await self._call(
                    op, tenant, session_id, fields, holder_only=holder_only, first=first, watch=True
                )
            except _Lost as lost:
                log.warning(
                    "agent host %s stopped before it answered %s for session %s: sending it again",
                    lost.host,
                    op,
                    session_id,
                )
            first = None  # where the lease says now

    async def _call(
        self,
        op: Op,
        tenant: str,
        session_id: str | None,
        fields: JsonObject,
        *,
        holder_only: bool = False,
        first: str | None = None,
        watch: bool = False,
    ) -> Any:
        """Send a command and return its host's reply. ``first``: the stream to try first
        (default: where the lease says); ``watch``: once acknowledged, the call fails with
        :class:`_Lost` when its host stops holding the session before it answers."""
        rid = f"{self.reply_channel}#{next(self._ids)}"
        call = _Call()
        self._calls[rid] = call
        data = commands.encode(
            commands.command(op, rid, self.reply_channel, tenant, session_id, fields)
        )
        deadline = time.monotonic() + self.route_deadline
        try:
            target = first  # the stream to try first; None: where the lease says
            while True:
                stream = target or await self._route(tenant, session_id, holder_only)
                if stream is None:
                    return {}  # nobody holds the session: nothing to cancel or release
                await self.bus.send(stream, data)
                outcome = await call.wait_ack(self.ack_timeout)
                if outcome == "ack":
                    if watch and session_id is not None and call.host:
                        return await self._watched(call, tenant, session_id, fields)
                    return await call.result()
                if isinstance(outcome, str) and outcome.startswith("moved:"):
                    target = host_inbox(outcome.removeprefix("moved:"))
                else:
                    target = None
                if time.monotonic() > deadline:
                    raise RpcError(INTERNAL_ERROR, "no agent host answered; try again shortly")
                call.reset()
        finally:
            self._calls.pop(rid, None)

    async def _watched(self, call: _Call, tenant: str, session_id: str, fields: JsonObject) -> Any:
        """The acknowledged call's reply; one not come within ``ack_timeout`` has its host
        watched meanwhile (:meth:`_watch`: a timer, no task, for the many answered sooner)."""
        prompt_id = fields.get("promptId")
        tasks: list[asyncio.Task[None]] = []

        def watch() -> None:
            tasks.append(asyncio.ensure_future(self._watch(call, tenant, session_id, prompt_id)))

        timer = asyncio.get_running_loop().call_later(self.ack_timeout, watch)
        try:
            return await call.result()
        finally:
            timer.cancel()
            for task in tasks:
                task.cancel()

    async def _watch(
        self, call: _Call, tenant: str, session_id: str, prompt_id: str | None
    ) -> None:
        """Fail ``call`` with :class:`_Lost` once the command is lost with the host that
        acknowledged it: that host has not held the session for two looks ``ack_timeout``
        apart (one look could fall between a host's acknowledgement of a command from the
        queue and its taking the lease) and, for a prompt, the log has no trace of the
        prompt. Ends without failing it once a prompt is recorded (its reply or its
        ``prompt_end`` event ends the turn then). A host runs a prompt only under its lease,
        so a prompt sent again runs once."""
        host = call.host or ""
        started = self._started.get(prompt_id) if prompt_id else None
        misses = 0
        try:
            while misses < 2:
                if started is not None and started.done():
                    return
                try:
                    held = await self._still_with(tenant, session_id, host, prompt_id)
                except (StoreError, OSError) as exc:  # not known now: the next look asks again
                    log.info("could not check the agent host of session %s: %s", session_id, exc)
                    held = True
                misses = 0 if held else misses + 1
                if misses < 2:
                    if started is None:
                        await asyncio.sleep(self.ack_timeout)
                    else:
                        await asyncio.wait({started}, timeout=self.ack_timeout)
        except Exception as exc:  # a fault of the watch itself fails the command, visibly
            log.exception("watching a command for session %s failed", session_id)
            call.fail(exc)
            return
        call.fail(_Lost(host))

    async def _still_with(
        self, tenant: str, session_id: str, host: str, prompt_id: str | None
    ) -> bool:
        """Whether ``host`` holds the session, or the log names ``prompt_id`` as running."""
        if prompt_id is None:
            return bool(await hosts.lease_holder(self.redis, tenant, session_id) == host)
        try:
            snapshot, holder = await SessionLog(self.redis).snapshot_and_holder(tenant, session_id)
        except SessionMissing:
            return False  # sent again, it fails as any prompt for a missing session
        return holder == host or snapshot.prompt_id == prompt_id

    async def _route(self, tenant: str, session_id: str | None, holder_only: bool) -> str | None:
        if session_id is None:
            return host_queue()
        holder = await hosts.lease_holder(self.redis, tenant, session_id)
        if holder:
            return host_inbox(holder)
        return None if holder_only else host_queue()


@dataclass
class _Flight:
    """An attach command in flight, which other clients asking alike wait for too."""

    params: JsonObject
    task: asyncio.Task[Any]


class _Call:
    """One command in flight: its acknowledgement, then its reply."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._ack: asyncio.Future[str] = loop.create_future()
        self._reply: asyncio.Future[Any] = loop.create_future()
        self.host: str | None = None
        """The host that acknowledged the command (None: none yet, or one too old to say)."""

    def reset(self) -> None:
        self._ack = asyncio.get_running_loop().create_future()

    def receive(self, message: JsonObject) -> None:
        kind = message.get("t")
        if kind == Reply.ACK:
            _settle(self._ack, "ack")
            self.host = message.get("host") or None
        elif kind == Reply.MOVED:
            _settle(self._ack, f"moved:{message.get('holder')}")
        elif kind == Reply.REPLY:
            _settle(self._ack, "ack")
            _settle(self._reply, message.get("result"))
        elif kind == Reply.ERROR:
            _settle(self._ack, "ack")
            if not self._reply.done():
                self._reply.set_exception(commands.rpc_error(message.get("error")))

    async def wait_ack(self, timeout: float) -> str | None:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self._ack), timeout)
        return None

    async def result(self) -> Any:
        return await self._reply

    def fail(self, exc: Exception) -> None:
        """End the call unanswered: :meth:`result` raises ``exc`` (:class:`_Lost`: its host
        died before answering)."""
        if not self._reply.done():
            self._reply.set_exception(exc)


class _Lost(Exception):
    """A command's host acknowledged it and stopped holding its session before answering."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.host = host


def _settle(future: asyncio.Future[Any] | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)
