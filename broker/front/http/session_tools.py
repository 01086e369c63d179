"""The session tools' operations, shared by the MCP tools and the REST routes.

:class:`SessionTools` creates, resumes, prompts, cancels, stops and deletes sessions
for a caller, through the same command path as ACP clients (the front's
:class:`~broker.protocol.commands.AgentGateway`: the same commands to the same agent
hosts, on the same sessions), so that a turn a tool drives is live in every window
where its session is active. Failures are :class:`~broker.errors.ApiError`\\ s, which
MCP renders as ``<code>: <message>`` results and REST as problem documents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from ...auth.authenticator import Authenticator as BrokerAuthenticator
from ...auth.credentials import Authenticator, Credentials, bearer_access, open_access
from ...auth.principal import Principal, Scope
from ...auth.roles import Permission
from ...config import Settings
from ...errors import ApiError, ErrorCode, invalid_argument
from ...errors.access import access_api_error, forbidden, revoked_while
from ...errors.interactions import interaction_api_error
from ...protocol.commands import UNATTENDED_ORIGIN, AgentGateway
from ...protocol.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    RESOURCE_NOT_FOUND,
    JsonObject,
    RpcError,
)
from ...store import hosts
from ...store.client import Store
from ...store.errors import StoreError
from ...store.events import EventType, LogEvent, SessionSnapshot, Status
from ...store.index import SessionIndex, row_of
from ...store.log import SessionLog, SessionMissing
from ...store.quotas import TenantFull, check_session_quota
from ...store.retry import STORE_AWAY, retrying
from ..acp.methods_v1 import _agent_params, title_update
from ..fanout import FanoutHub
from ..session_acl import Fence, SessionAcl
from .console import LIVE_VIEW_PATH
from .follow import Follower, following
from .tool_models import CreateSession
from .turns import TurnReport, see, turn_report

log = logging.getLogger(__name__)

T = TypeVar("T")

TOOL_ORIGIN = UNATTENDED_ORIGIN
"""The ``origin`` of what a tool does: no connection, so an agent's question during a
tool-driven turn goes to every window where the session is active (and waits for one)."""


@dataclass(frozen=True, slots=True)
class SessionView:
    """A session as a tool shows it: its listing row and its live view URL."""

    row: JsonObject
    live_view_url: str


@dataclass(frozen=True, slots=True)
class TurnView:
    """A prompt's turn as far as it went within the wait, with its live view URL."""

    report: TurnReport
    live_view_url: str


def live_view_url(base: str, session_id: str) -> str:
    """The console's deep link to one session (``base``: the public or request address)."""
    return f"{base.rstrip('/')}{LIVE_VIEW_PATH}{session_id}"


def stdio_base(settings: Settings) -> str:
    """The live view's base where no request names one: the public URL, else this
    deployment's HTTP port on its configured host."""
    if settings.public_url:
        return settings.public_url
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.http_listen_port()}"


def request_base(settings: Settings, url_base: str) -> str:
    """The live view's base for an HTTP request that came to ``url_base``."""
    return settings.public_url or url_base


def tool_access(
    settings: Settings, authenticator: BrokerAuthenticator | None
) -> dict[Scope, Authenticator]:
    """Who may read and who may change, per scope: bearer credentials with that scope where
    authentication is on; everyone, as the settings' tenant, where it is off (or over stdio:
    whoever runs ``acp-broker mcp`` holds the Redis URL)."""
    if authenticator is None or not authenticator.enabled:
        return {scope: open_access(settings.tenant) for scope in (Scope.READ, Scope.WRITE)}
    return {scope: bearer_access(authenticator, scope) for scope in (Scope.READ, Scope.WRITE)}


def not_found(session_id: str) -> ApiError:
    return ApiError(ErrorCode.SESSION_NOT_FOUND, f"no session {session_id}")


def api_error(exc: RpcError) -> ApiError:
    """An agent host's or the ACP layer's refusal, as the tools name it."""
    refused = interaction_api_error(exc) or access_api_error(exc)
    if refused is not None:
        return refused
    if exc.code == RESOURCE_NOT_FOUND:
        return ApiError(ErrorCode.SESSION_NOT_FOUND, exc.message)
    if exc.code == INVALID_PARAMS:
        return invalid_argument(exc.message)
    if exc.code == INVALID_REQUEST and "already running" in exc.message:
        return ApiError(ErrorCode.SESSION_BUSY, exc.message)
    return ApiError(ErrorCode.UNAVAILABLE, f"the agent host could not do it: {exc.message}")


async def _any_fenced(fence: Fence | None, events: list[LogEvent]) -> bool:
    """Whether ``fence`` stops at one of ``events`` (a revoke logged after the follow ended,
    before the log was read: the read holds what came after it too)."""
    if fence is None:
        return False
    for event in events:
        if await fence(event):
            return True
    return False


class SessionTools:
    """The operations of the session tools, for an authenticated tenant."""

    def __init__(
        self,
        settings: Settings,
        log: SessionLog,
        index: SessionIndex,
        hub: FanoutHub,
        agents: AgentGateway,
        access: Mapping[Scope, Authenticator],
    ) -> None:
        self.settings = settings
        self.log = log
        self.index = index
        self.hub = hub
        self.agents = agents
        self.access = access
        self.acl = SessionAcl(log)
        self.redis: Store = index.redis
        self.cancel_wait = settings.request_timeout
        self.unreachable: str | None = None
        """Why this process cannot reach agent hosts at all (None: it can try)."""
        self._turns: set[asyncio.Future[Any]] = set()

    async def authorize(self, credentials: Credentials, scope: Scope) -> str:
        """The caller's tenant, if its credential has ``scope`` (``unauthorized``,
        ``forbidden`` otherwise)."""
        return (await self.caller(credentials, scope)).tenant

    async def caller(self, credentials: Credentials, scope: Scope) -> Principal:
        """The caller, if its credential has ``scope`` (``unauthorized``, ``forbidden``)."""
        return await self.access[scope](credentials)

    async def require(
        self, caller: Principal, session_id: str, permission: Permission, operation: str
    ) -> None:
        """Refuse (``forbidden``, REST 403) an operation on ``session_id`` that ``caller``'s
        effective roles there do not allow (:class:`~..session_acl.SessionAcl`)."""
        if not await self.acl.allows(caller, session_id, permission):
            raise ApiError(ErrorCode.FORBIDDEN, forbidden(permission, operation).message)

    async def guarded(self, call: Awaitable[T]) -> T:
        """``call``, its store and agent failures named as the tools name them."""
        try:
            return await call
        except ApiError:
            raise
        except RpcError as exc:
            raise api_error(exc) from None
        except TenantFull as exc:
            raise ApiError(ErrorCode.FORBIDDEN, str(exc)) from None
        except SessionMissing as exc:  # gone between two reads (purged)
            raise not_found(str(exc)) from None
        except (*STORE_AWAY, StoreError, TimeoutError) as exc:
            raise ApiError(
                ErrorCode.UNAVAILABLE, f"the session store cannot be reached ({exc}); retry later"
            ) from exc
        except Exception as exc:
            log.exception("a session tool failed")
            raise ApiError(ErrorCode.INTERNAL, f"the broker failed: {exc}") from exc

    # -- reading ------------------------------------------------------------------------------

    async def snapshot(self, tenant: str, session_id: str) -> SessionSnapshot:
        """The session's snapshot (a deleted one too); ``session_not_found`` for none."""
        try:
            return await self.log.snapshot(tenant, session_id)
        except SessionMissing:
            raise not_found(session_id) from None

    async def live(self, tenant: str, session_id: str) -> SessionSnapshot:
        """The snapshot of a session that is not deleted."""
        snapshot = await self.snapshot(tenant, session_id)
        if snapshot.deleted:
            raise not_found(session_id)
        return snapshot

    async def view(
        self, tenant: str, session_id: str, base: str, *, project: bool = True
    ) -> SessionView:
        """The session as it is now; ``project``: after a change, so the index lists it as
        it is now (the caller's next list sees the change)."""
        snapshot = await self.snapshot(tenant, session_id)
        if project:
            await retrying(lambda: self.index.project(snapshot), self.settings.request_timeout)
        return SessionView(row_of(snapshot), live_view_url(base, session_id))

    # -- changing -----------------------------------------------------------------------------

    async def create(
        self, tenant: str, inputs: CreateSession, base: str, owner: Principal | None = None
    ) -> SessionView:
        """A session as ``session/new`` makes it (``cwd``, ``agent``, ``title``,
        ``userMetadata``), ``owner`` its first owner; its first prompt is :meth:`prompt`'s."""
        params = _agent_params({}, inputs.cwd, [], inputs.userMetadata)
        agent = inputs.agent or self.agents.default_agent
        kind = self.agents.kind_of(agent)
        meta = params.get("_meta", {})
        await check_session_quota(self.redis, tenant, self.settings.max_sessions_per_tenant)
        await self._need_hosts()
        session_id, _ = await self.agents.new_session(
            tenant, params, agent=agent, kind=kind, meta=meta, origin=TOOL_ORIGIN
        )
        if owner is not None:
            await retrying(
                lambda: self.acl.record_owner(owner, session_id), self.settings.request_timeout
            )
        if inputs.title is not None:
            update = title_update({"title": inputs.title})
            body = {"type": EventType.UPDATE, "update": update, "origin": TOOL_ORIGIN}
            await retrying(
                lambda: self.log.append(tenant, session_id, body), self.settings.request_timeout
            )
        return await self.view(tenant, session_id, base)

    async def resume(self, tenant: str, session_id: str, base: str) -> SessionView:
        """Bring a ``STOPPED`` or ``ERROR`` session back onto an agent process (a no-op on a
        running one)."""
        await self.live(tenant, session_id)
        await self._need_hosts()
        # A held session's host answers at once (nothing to do); one no host holds is
        # restored onto an agent process, recorded RUNNING.
        await self.agents.attach(tenant, session_id, {"mcpServers": []})
        return await self.view(tenant, session_id, base)

    async def stop(self, tenant: str, session_id: str, base: str) -> SessionView:
        """Let the session's agent process go (``STOPPED``); its log is kept whole."""
        self._need_front()
        snapshot = await self.live(tenant, session_id)
        if snapshot.status == Status.RUNNING:
            await self.agents.stop(tenant, session_id)
            snapshot, holder = await self.log.snapshot_and_holder(tenant, session_id)
            if snapshot.status == Status.RUNNING and holder is None:
                # No host held it (its host died and none took it over yet): recorded here.
                body = {"type": EventType.STATUS, "status": Status.STOPPED}
                await self.log.append(tenant, session_id, body)
        return await self.view(tenant, session_id, base)

    async def delete(self, tenant: str, session_id: str, base: str) -> SessionView:
        """As ``session/delete``; a deleted session's line again (idempotent)."""
        self._need_front()
        snapshot = await self.snapshot(tenant, session_id)
        if not snapshot.deleted:
            await self.log.append(tenant, session_id, {"type": EventType.DELETED})
            await self.agents.release(tenant, session_id)
        return await self.view(tenant, session_id, base)

    async def cancel(
        self, tenant: str, session_id: str, activity_id: str | None = None, author: str = ""
    ) -> str | None:
        """Cancel the running turn; its stop reason (None: no turn was running).
        ``activity_id``: only that prompt's turn; a queued one is withdrawn when ``author``
        (the caller's principal subject) is its author (:meth:`withdraw`)."""
        self._need_front()
        snapshot = await self.live(tenant, session_id)
        prompt_id = snapshot.prompt_id
        if activity_id is not None and activity_id != prompt_id:
            return await self.withdraw(tenant, session_id, activity_id, author)
        if prompt_id is None:
            return None
        async with following(self.hub, tenant, session_id) as (follower, after):
            # What came between the snapshot and the follow's start (the turn may have
            # ended meanwhile), then what comes live.
            report = TurnReport(prompt_id, started=True)
            if after > snapshot.seq:
                between = await self.log.read(tenant, session_id, after=snapshot.seq, until=after)
                for event in between:
                    see(report, event)
            if not report.ended:
                await self.agents.cancel(tenant, session_id, activity_id, author)
                await self._until(report, follower, None, self.cancel_wait)
        if not report.ended:
            raise ApiError(
                ErrorCode.UNAVAILABLE,
                f"the turn did not end within {self.cancel_wait:g} s of its cancel; try again",
            )
        return report.stop_reason or "error"

    async def withdraw(
        self, tenant: str, session_id: str, activity_id: str, author: str
    ) -> str | None:
        """Withdraw the queued prompt ``activity_id`` (the agent host decides: only its
        author may); ``"cancelled"`` when it was withdrawn, None when the host logged the
        cancel as a no-op (``cancel_ignored``: not its author, or nothing waits under it)."""
        await self._need_hosts()
        async with following(self.hub, tenant, session_id) as (_, after):
            await self.agents.cancel(tenant, session_id, activity_id, author)
            events = await self.log.read(tenant, session_id, after=after)
        facts = (EventType.PROMPT_WITHDRAWN, EventType.CANCEL_IGNORED)
        for event in reversed(events):
            if event.type in facts and activity_id in (
                event.body.get("promptId"),
                event.body.get("activityId"),
            ):
                return "cancelled" if event.type == EventType.PROMPT_WITHDRAWN else None
        return None

    async def prompt(
        self,
        tenant: str,
        session_id: str,
        text: str,
        wait: float,
        base: str,
        author: Principal | None = None,
    ) -> TurnView:
        """Run one turn (after the turns before it in the session's queue); what it produced
        once it ended, waits for a person, or ``wait`` seconds passed (it runs on then, live
        in every window). ``author``: the caller's principal, who alone may
        withdraw it while it is queued (from REST, MCP or ACP alike)."""
        snapshot = await self.live(tenant, session_id)
        if snapshot.status in (Status.STOPPED, Status.ERROR):
            raise ApiError(
                ErrorCode.SESSION_NOT_RUNNING,
                f"session {session_id} is {snapshot.status}: call session_resume first",
            )
        await self._need_hosts()
        prompt_id = secrets.token_hex(8)
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        # A revoke that takes the author's session.read ends the following, as it ends an
        # event stream: the turn runs on, what it does no longer the caller's to see.
        fence = None if author is None else partial(self.acl.lost_read, author, session_id)
        async with following(self.hub, tenant, session_id) as (follower, after):
            turn = self._spawn(self._turn(tenant, session_id, params, prompt_id, author))
            report = TurnReport(prompt_id)
            fenced = await self._until(report, follower, turn, wait, fence)
            events = [] if fenced else await self.log.read(tenant, session_id, after=after)
        if fenced or await _any_fenced(fence, events):
            refused = revoked_while(Permission.READ, "the turn")
            raise ApiError(ErrorCode.FORBIDDEN, refused.message)
        report = turn_report(prompt_id, events)
        if not report.started and turn.done() and turn.exception() is not None:
            raise turn.exception()  # type: ignore[misc]  # refused before it began
        return TurnView(report, live_view_url(base, session_id))

    async def close(self) -> None:
        """Stop waiting for the turns tools started (they run on in their agent hosts)."""
        turns = list(self._turns)
        for turn in turns:
            turn.cancel()
        await asyncio.gather(*turns, return_exceptions=True)

    # -- internals ----------------------------------------------------------------------------

    async def _turn(
        self,
        tenant: str,
        session_id: str,
        params: JsonObject,
        prompt_id: str,
        author: Principal | None,
    ) -> None:
        """The turn, to its end (it outlives a tool call's wait), then the index told."""
        await self.agents.prompt(tenant, session_id, params, TOOL_ORIGIN, prompt_id, author)
        snapshot = await self.log.snapshot(tenant, session_id)
        await self.index.project(snapshot)

    def _spawn(self, work: Awaitable[None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(work)
        self._turns.add(task)
        task.add_done_callback(self._turn_done)
        return task

    def _turn_done(self, task: asyncio.Future[Any]) -> None:
        self._turns.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("a tool-driven turn ended with an error: %s", task.exception())

    async def _until(
        self,
        report: TurnReport,
        follower: Follower,
        turn: asyncio.Future[None] | None,
        wait: float,
        fence: Fence | None = None,
    ) -> bool:
        """Fold the followed events into ``report`` until its turn ended or waits for a
        person, ``turn`` (its request) ended, or ``wait`` seconds passed; True, at once,
        when an event took the follower's ``session.read`` (``fence`` says which)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not (report.ended or report.waiting):
            left = deadline - loop.time()
            if left <= 0:
                return False
            if turn is not None and turn.done():
                return False
            waiting: set[asyncio.Future[Any]] = {nxt := asyncio.ensure_future(follower.next())}
            if turn is not None:
                waiting.add(turn)
            done, _ = await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if nxt in done:
                event = nxt.result()
                if fence is not None and await fence(event):
                    return True
                see(report, event)
            else:
                nxt.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await nxt
        return False

    def _need_front(self) -> None:
        if self.unreachable is not None:
            raise ApiError(ErrorCode.UNAVAILABLE, self.unreachable)

    async def _need_hosts(self) -> None:
        self._need_front()
        if not await hosts.any_alive(self.redis):
            raise ApiError(
                ErrorCode.UNAVAILABLE,
                "no agent host is reachable (none announced itself lately); start one "
                "(acp-broker serve or acp-broker agent-host) and try again",
            )
