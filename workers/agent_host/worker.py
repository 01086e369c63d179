"""The agent-host role: an :class:`AgentHost` driven by commands that arrive through Redis.

A host reads two streams: its own inbox (commands for sessions it holds) and
the shared queue (new sessions, sessions no host holds), which all hosts read
as one consumer group. Every command is acknowledged at once on the asking
node's channel and answered there when done. The host renews its leases, and
takes over the sessions of hosts that died (their leases lapsed) within a
bounded time: the agent gets each session back, and a prompt that was running
is ended with an error.

Agent-to-client requests are published on the session's live channel, where
every front node with the session active sees them; the node holding the
preferred connection (the prompt's sender) asks it, the first answer wins and
the others are told the request is settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Coroutine
from typing import Any

from broker.auth.roles import Authority
from broker.config import Settings
from broker.errors.failures import FailureLog, describe
from broker.errors.store import rpc_failure
from broker.lifetimes import RoleLoops
from broker.loops import cancel_and_wait
from broker.ops import metrics
from broker.protocol import commands
from broker.protocol.commands import Op
from broker.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    JsonObject,
    RpcError,
    session_not_found,
)
from broker.store import hosts
from broker.store.archive import ArchiveStore
from broker.store.bus import CommandBus
from broker.store.client import Store
from broker.store.errors import StoreError, group_missing
from broker.store.groups import Entries
from broker.store.keys import host_inbox, host_queue
from broker.store.leases import HeldElsewhere, Leases
from broker.store.live import Publisher
from broker.store.log import SessionLog, SessionMissing
from broker.store.retry import is_store_away, retrying, unheard

from .clients import RemoteClients
from .host import AgentHost
from .sandbox import sandbox_policy
from .streams import run_command_trimming
from .taken import TakenMarks, kept_reply

log = logging.getLogger(__name__)

QUEUE_GROUP = "hosts"
QUEUE_WINDOW_MS = 30_000
"""How far back the first host to read the shared queue starts reading it: a front sends a
command again every ``ack_timeout`` until its route deadline (30 s), so a command queued
within it has a front waiting for its answer (the fronts start faster than the hosts: a
``session/new`` sent a moment before the first host is up is run, not lost); older ones are
stale, their fronts gave up. Copies of one command are run once (see :mod:`.taken`)."""
CREATING = frozenset({Op.NEW.value, Op.FORK.value})
"""Commands that make a session: run once per call id, whichever hosts get copies of it
(see :mod:`.taken`)."""


class HostWorker:
    """Runs an :class:`AgentHost` for the commands front nodes send through Redis."""

    def __init__(
        self,
        redis: Store,
        settings: Settings,
        *,
        host_id: str | None = None,
        archive: ArchiveStore | None = None,
    ) -> None:
        self.redis = redis
        self.settings = settings
        self.host_id = host_id or f"host-{secrets.token_hex(6)}"
        self.inbox = host_inbox(self.host_id)
        self.bus = CommandBus(redis)
        self.publisher = Publisher(redis)
        self.leases = Leases(redis, self.host_id, ttl=settings.lease_ttl)
        self.marks = TakenMarks(redis, self.host_id)
        self.clients = RemoteClients(
            redis,
            self.inbox,
            timeout=settings.client_request_timeout,
            reask_interval=settings.client_reask_interval,
            reconnect_grace=settings.client_reconnect_grace,
        )
        self.host = AgentHost(
            settings.agent_list(),
            SessionLog(
                redis,
                feed_maxlen=settings.feed_maxlen,
                archive=archive,
                max_events=settings.max_events_per_session,
            ),
            self.clients,
            self.leases,
            request_timeout=settings.agent_request_timeout,
            max_pending_updates=settings.max_pending_updates,
            cancel_grace=settings.cancel_grace,
            agent_env=settings.agent_env,
            on_agent_started=self._publish_capabilities,
            sandbox=sandbox_policy(settings),
            idle_timeout=settings.agent_idle_timeout,
            max_processes=settings.max_agent_processes,
        )
        self.host.log.wait_for_replicas(settings.redis_wait_replicas, settings.redis_wait_timeout)
        self.read_failures = FailureLog(log, "reading commands")
        self.ack_failures = FailureLog(log, "acknowledging queued commands")
        self.lease_failures = FailureLog(log, "lease upkeep")
        self._tasks: set[asyncio.Task[Any]] = set()
        """The commands running (one task each, tracked here until done; cancelled on stop)."""
        self.role_loops = RoleLoops("agent host")
        """The role's loops: the inbox, the shared queue, the leases, the streams' trim."""
        self.role_loops.add("host-inbox", self._read_inbox)
        self.role_loops.add("host-queue", self._read_queue)
        self.role_loops.add("host-leases", self._keep_leases)
        self.role_loops.add(
            "host-command-trimming",
            lambda: run_command_trimming(self.redis, self.inbox, self._inbox_read, QUEUE_GROUP),
        )
        self._inbox_last: str | None = None

    async def start(self) -> None:
        await self._create_group(queue_window_start(time.time()))
        await hosts.announce(self.redis, self.host_id, self.settings.lease_ttl)
        await self.role_loops.start()
        await self.host.start(prestart=self.settings.prestart_agents)

    def loops(self) -> list[asyncio.Task[Any]]:
        """The tasks of the role's loops (see :attr:`role_loops`)."""
        return list(self.role_loops.tasks())

    async def __aenter__(self) -> HostWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(hand_over=True)

    async def stop(self, *, hand_over: bool = False) -> None:
        await self.role_loops.stop()
        await cancel_and_wait(*self._tasks)
        with contextlib.suppress(StoreError, OSError):  # it lapses by itself within lease_ttl
            await hosts.withdraw(self.redis, self.host_id)
        await self.host.stop(hand_over=hand_over)

    async def run(self) -> None:
        """The role as a coroutine: start, then serve until cancelled (handing sessions over)."""
        async with self:
            await asyncio.Event().wait()

    # -- reading commands ---------------------------------------------------------------------

    async def _read_inbox(self) -> None:
        # Restarted after a failure (see RoleLoops), it reads on after the last entry it
        # read, not from "now": commands that came meanwhile are run.
        last = self._inbox_last or "$"
        while True:
            entries = await self._guarded(
                self.bus.read_inbox(self.inbox, last, count=100, block_ms=1000)
            )
            for entry_id, fields in entries or []:
                last = self._inbox_last = entry_id
                self._take_entry(self.inbox, entry_id, fields)

    def _inbox_read(self) -> str | None:
        """The last inbox entry read (None: none yet): the inbox is trimmed up to it."""
        return self._inbox_last

    async def _create_group(self, start: str) -> None:
        await self.bus.create_queue_group(QUEUE_GROUP, start)

    async def _queue_batch(self) -> Entries | None:
        try:
            return await self.bus.read_queue(QUEUE_GROUP, self.host_id, count=10, block_ms=1000)
        except StoreError as exc:
            if not group_missing(exc):
                raise
            # Redis came back empty (no persistence, a fresh replica, a flush): the group
            # is gone with the queue. Make it again, from the start of the new queue.
            log.warning("the command queue's consumer group is gone: creating it again")
            await self._create_group("0")
            return None

    async def _read_queue(self) -> None:
        while True:
            entries = await self._guarded(self._queue_batch())
            if entries:
                await self._ack_queued([entry_id for entry_id, _ in entries])
            for entry_id, fields in entries or []:
                self._take_entry(host_queue(), entry_id, fields)

    async def _ack_queued(self, entry_ids: list[str]) -> None:
        """Acknowledge commands read from the shared queue. When Redis fails the XACK, the
        failure is logged and the commands are run all the same: this host read them and no
        other will (the queue is read for new entries only), they only stay pending in the
        group. (An XACK that raised out of the loop once ended the host's reading of the
        queue for good: no new session was served here until a restart.)"""
        try:
            await self.bus.ack_queued(QUEUE_GROUP, entry_ids)
        except (StoreError, OSError) as exc:
            self.ack_failures.failed(exc)
        else:
            self.ack_failures.succeeded()

    async def _guarded(self, call: Any) -> Any:
        """A blocking read that survives Redis hiccups (and notices cancellation)."""
        try:
            result = await call
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from None
            self.read_failures.failed(exc)
            await asyncio.sleep(0.5)
            return None
        self.read_failures.succeeded()
        return result

    def _take_entry(self, stream: str, entry_id: str, fields: dict[str, Any]) -> None:
        """One stream entry taken: a malformed one is logged in a line, answered with an
        error where it names its reply channel, and skipped (already read past, or acked),
        so the loop serves the next entries. (One raised out of the loop once: the host
        read that stream no more until a restart.)"""
        command: Any = None
        try:
            if "m" not in fields:
                raise ValueError("no field m")
            command = json.loads(fields["m"])
            self._take(checked_command(command))
        except Exception as exc:
            log.warning("skipped malformed entry %s of %s: %s", entry_id, stream, describe(exc))
            self._refuse(command, exc)

    def _refuse(self, command: Any, exc: Exception) -> None:
        """Tell a malformed command's sender why it is not run, where it says where."""
        if not isinstance(command, dict) or command.get("op") == Op.CLIENT_REPLY:
            return  # nowhere to answer (a client's answer is asked for again: see .clients)
        reply_to, rid = command.get("reply"), command.get("rid")
        if not isinstance(reply_to, str) or rid is None:
            return
        refusal = RpcError(INVALID_PARAMS, f"malformed command: {describe(exc)}")
        self._spawn(self._send(reply_to, commands.error(rid, refusal)))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _take(self, command: JsonObject) -> None:
        if command.get("op") == Op.CLIENT_REPLY:
            self.clients.on_reply(command)
            return
        self._spawn(self._execute(command))

    # -- executing commands -------------------------------------------------------------------

    async def _execute(self, command: JsonObject) -> None:
        reply_to, rid = str(command["reply"]), command["rid"]
        creating = command.get("op") in CREATING
        if creating:
            mark = await self.marks.take(str(rid))
            if mark is not None:
                await self._answer_copy(reply_to, rid, mark)
                return
        await self._acknowledge(reply_to, rid)
        if creating:
            async with self.marks.running(str(rid)):
                reply = await self._reply(command)
            await self.marks.done(str(rid), commands.encode(reply))
        else:
            reply = await self._reply(command)
        await self._send(reply_to, reply)

    async def _acknowledge(self, reply_to: str, rid: Any) -> None:
        """Tell the front its command is taken: once, and when no front heard it (Redis away,
        or the front's subscription being made again) again in the background while the
        command runs (its reply settles the front's wait as well)."""
        ack = commands.ack(rid, self.host_id)
        with contextlib.suppress(StoreError, OSError):  # tried again just below
            if not unheard(await self.publisher.publish(reply_to, commands.encode(ack))):
                return
        self._spawn(self._send(reply_to, ack))

    async def _answer_copy(self, reply_to: str, rid: Any, mark: str) -> None:
        """A copy of a creating command taken already (see :mod:`.taken`): answered with the
        reply kept, acknowledged again while this host runs it, left to the host that does."""
        kept = kept_reply(mark)
        if kept is not None:
            log.info("command %s was answered already: its reply sent again", rid)
            await self._send(reply_to, json.loads(kept))
        elif self.marks.mine(mark):
            log.info("command %s is run here already: its copy acknowledged again", rid)
            await self._send(reply_to, commands.ack(rid, self.host_id))
        else:
            log.info("command %s is run by another host (%s): not run here", rid, mark)

    async def _reply(self, command: JsonObject) -> JsonObject:
        """Run ``command``: the reply for its front (a result, an error, or "moved")."""
        rid = command["rid"]
        try:
            result = await self._dispatch(command)
        except HeldElsewhere as exc:
            return commands.moved(rid, exc.holder)
        except RpcError as exc:
            return commands.error(rid, exc)
        except SessionMissing:
            return commands.error(rid, session_not_found(str(command.get("sid") or "")))
        except Exception as exc:
            failure = rpc_failure(exc)
            if failure is None:
                log.exception("command %s failed", command.get("op"))
                failure = RpcError(INTERNAL_ERROR, "internal error")
            elif is_store_away(exc):  # its client is told so (not "internal error"), in one line
                log.warning("command %s failed: %s", command.get("op"), describe(exc))
            return commands.error(rid, failure)
        return commands.result(rid, result)

    async def _dispatch(self, command: JsonObject) -> Any:
        op, tenant, sid = command["op"], str(command["tenant"]), str(command.get("sid") or "")
        host = self.host
        if op == Op.NEW:
            session_id, reply = await host.new_session(
                tenant,
                command["params"],
                agent=command["agent"],
                kind=command["kind"],
                meta=command["meta"],
                origin=command["origin"],
            )
            return {"sessionId": session_id, "reply": reply}
        if op == Op.FORK:
            session_id, reply, copied = await host.fork(
                tenant, sid, command["params"], meta=command["meta"], origin=command["origin"]
            )
            return {"sessionId": session_id, "reply": reply, "copied": copied}
        if op == Op.ATTACH:
            return await host.attach(tenant, sid, command["params"])
        if op == Op.PROMPT:
            outcome = await host.prompt(
                tenant,
                sid,
                command["params"],
                command["origin"],
                command.get("promptId"),
                author=str(command.get("author") or ""),
                authority=authority_of(command),
            )
            return commands.prompt_reply(outcome)
        if op == Op.CANCEL:
            activity = command.get("activityId")
            origin = str(command.get("origin") or "")
            return await host.cancel(
                tenant, sid, activity if isinstance(activity, str) else None, origin
            )
        if op == Op.CLOSE:
            return await host.close(tenant, sid, command["origin"])
        if op == Op.FORWARD:
            return await host.forward(tenant, sid, command["method"], command["params"])
        if op == Op.RELEASE:
            return await host.release(tenant, sid)
        if op == Op.INTERACT:
            held = host.sessions.by_id.get(sid)
            held = held if held is not None and held.tenant == tenant else None
            return await host.requests.interactions.act(
                held,
                str(command["action"]),
                command["params"],
                str(command["principal"]),
                authority_of(command),
            )
        if op == Op.FENCE:
            return await host.fence(tenant, sid)
        if op == Op.STOP:
            return await host.stop_session(tenant, sid)
        raise RpcError(INTERNAL_ERROR, f"unknown command {op!r}")

    async def _send(self, channel: str, message: JsonObject) -> None:
        """An acknowledgement or a reply to a front node, tried again while Redis is away or
        while no front hears it (one resubscribing after Redis came back); one that still
        cannot be sent is logged (the front's deadline then fails the request for its
        client)."""
        data = commands.encode(message)
        try:
            heard = await retrying(
                lambda: self.publisher.publish(channel, data),
                self.settings.answer_timeout,
                again=unheard,  # the front resubscribing after Redis returned: it hears a retry
            )
        except (StoreError, OSError) as exc:
            log.error(
                "could not send %s %s to %s: %s: %s",
                message.get("t"),
                message.get("rid"),
                channel,
                type(exc).__name__,
                exc,
            )
            return
        if unheard(heard):
            log.warning(
                "no front heard %s %s on %s within %g s (its node is gone?)",
                message.get("t"),
                message.get("rid"),
                channel,
                self.settings.answer_timeout,
            )

    async def _publish_capabilities(self, name: str, capabilities: JsonObject) -> None:
        """What an agent advertised, for the fronts' ``initialize`` answers: written again
        while Redis is briefly away; one still not written is logged (the fronts keep what
        they read before, and the agent's next start writes it again)."""
        text = json.dumps(capabilities)
        try:
            await retrying(
                lambda: hosts.publish_capabilities(self.redis, name, text),
                self.settings.answer_timeout,
            )
        except StoreError as exc:
            log.warning("could not publish agent %s's capabilities: %s", name, describe(exc))

    # -- leases -------------------------------------------------------------------------------

    async def _keep_leases(self) -> None:
        interval = self.settings.lease_ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await hosts.announce(self.redis, self.host_id, self.settings.lease_ttl)
                renewal = await self.leases.renew_all(self.host.held_sessions(), self.host.fences())
                for _, session_id in renewal.lost:
                    self.host.lose(session_id, vanished=session_id in self.leases.vanished)
                # Archived (idle): no host needs to hold them. Side by side, so that many at
                # once (each closed in its agent) do not hold the next renewal back.
                await asyncio.gather(*(self.host.release(*held) for held in renewal.archived))
                await self._take_over()
                metrics.LEASES_HELD.set(len(self.host.held_sessions()))
                self.lease_failures.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.lease_failures.failed(exc)

    async def _take_over(self) -> None:
        """Give the agent back every session whose host died (its lease lapsed)."""
        for tenant, session_id in await self.leases.expired():
            try:
                await self.host.attach(tenant, session_id, {})
                log.info("took over session %s", session_id)
                metrics.LEASES_TAKEN_OVER.inc()
            except HeldElsewhere:
                continue
            except (RpcError, SessionMissing) as exc:
                log.warning("could not take over session %s: %s", session_id, exc)
                await self.leases.forget(tenant, session_id)


def queue_window_start(now: float) -> str:
    """The queue entry id a new consumer group starts after, at Unix time ``now`` (the ids
    of stream entries are Redis's clock in ms): :data:`QUEUE_WINDOW_MS` back."""
    return f"{max(int(now * 1000) - QUEUE_WINDOW_MS, 0)}-0"


def checked_command(command: Any) -> JsonObject:
    """``command`` (an entry's decoded ``m``) if it has what :meth:`HostWorker._execute`
    reads before it can answer; else ValueError saying what is missing."""
    if not isinstance(command, dict):
        raise ValueError("m is not a JSON object")
    if command.get("op") == Op.CLIENT_REPLY:
        return command
    for name in ("op", "rid", "reply", "tenant"):
        if not isinstance(command.get(name), str):
            raise ValueError(f"no {name} (a string)")
    return command


def authority_of(command: JsonObject) -> Authority | None:
    """What a prompt command's author was accepted with (None: its front sent none)."""
    raw = command.get("authority")
    return Authority.from_json(raw) if isinstance(raw, dict) else None
