"""The contract between front nodes and agent hosts: commands, replies, client requests.

Pure: message shapes and what they mean, no I/O. Where the messages travel is
:mod:`broker.store.keys`' business (``host_inbox``, ``host_queue``,
``node_channel``, a session's ``channel``); who sends them is the front's
:mod:`broker.front.agents` and the agent host's ``workers.agent_host.worker``.

A command (stream entry field ``m``, JSON) goes from a front to a host::

    {"op": <Op>, "rid": <call id>, "reply": <node channel>, "tenant": ..., "sid": ..., ...}

The host answers on the ``reply`` channel, first with an acknowledgement, then
with the outcome; each message names the call by ``rid`` and its kind by ``t``::

    {"t": "ack", "rid": ...}                 taken; the outcome follows
    {"t": "moved", "rid": ..., "holder": h}  another host holds the session: send it there
    {"t": "reply", "rid": ..., "result": r}
    {"t": "error", "rid": ..., "error": {"code": ..., "message": ..., "data": ...}}

A host asks a session's clients something (``session/request_permission``,
``fs/*``, ``terminal/*``) on the session's channel, every front where the
session is active hears it, and fronts answer into the host's inbox::

    {"kind": "creq", "rid": ..., "reply": <host inbox>, "method": ..., "params": ...,
     "prefer": <connection id or null>}
    {"kind": "csettled", "rid": ...}         answered elsewhere: withdraw the request
    {"op": "creply", "rid": ..., "node": <node id>, "result" | "error" | "none": ...}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from ..auth.principal import Principal
from ..auth.roles import Authority
from ..model.events import JsonObject, LogEvent, Position
from .jsonrpc import INTERNAL_ERROR, RpcError

UNATTENDED_ORIGIN = ""
"""The ``origin`` of a command no client connection sent (a session tool, over MCP or
REST). An agent's question during a turn of this origin has no prompting window: it goes
to every window where the session is active and, while there is none, waits (asked again
every re-ask interval, up to the client request timeout) for one to open, such as the
tool's live view."""

SESSION_NOT_FOUND = -32002
"""The JSON-RPC code of a session that does not exist (in the caller's tenant)."""


class Op(StrEnum):
    """What a command asks of an agent host (the ``op`` field)."""

    NEW = "new"  # params, agent, kind, meta, origin -> {sessionId, reply}
    FORK = "fork"  # params, meta, origin -> {sessionId, reply, copied (last copied seq)}
    ATTACH = "attach"  # params (the client's load/resume) -> the agent's reply
    PROMPT = "prompt"  # params, origin, promptId -> {result, seq, epoch}
    CANCEL = "cancel"
    CLOSE = "close"  # origin
    FORWARD = "forward"  # method, params: any other session method, passed to the agent
    RELEASE = "release"  # stop holding the session (deleted)
    STOP = "stop"  # stop holding the session, recorded STOPPED (a resume brings it back)
    CLIENT_REPLY = "creply"  # a front's answer to a client request (see module doc)
    INTERACT = "interact"  # action, params, principal: a pending interaction's list/claim/…
    FENCE = "fence"  # the session's ACL lost entries: claims whose authority went reopen


class Reply(StrEnum):
    """What a host's message on a node channel is (the ``t`` field)."""

    ACK = "ack"
    MOVED = "moved"
    REPLY = "reply"
    ERROR = "error"


class SessionMessage(StrEnum):
    """What a host publishes on a session's channel besides events (the ``kind`` field)."""

    CLIENT_REQUEST = "creq"
    CLIENT_SETTLED = "csettled"


def encode(message: JsonObject) -> str:
    """A message as it travels (compact JSON)."""
    return json.dumps(message, separators=(",", ":"))


def command(
    op: Op, rid: str, reply_to: str, tenant: str, session_id: str | None, fields: JsonObject
) -> JsonObject:
    """A command for an agent host; ``session_id`` None for a new session."""
    return {
        "op": op.value,
        "rid": rid,
        "reply": reply_to,
        "tenant": tenant,
        "sid": session_id,
        **fields,
    }


def ack(rid: str, host: str) -> JsonObject:
    """``host`` took the command: no need to route it again while that host lives."""
    return {"t": Reply.ACK.value, "rid": rid, "host": host}


def moved(rid: str, holder: str) -> JsonObject:
    return {"t": Reply.MOVED.value, "rid": rid, "holder": holder}


def result(rid: str, value: Any) -> JsonObject:
    return {"t": Reply.REPLY.value, "rid": rid, "result": value}


def error(rid: str, rpc_error: RpcError) -> JsonObject:
    return {"t": Reply.ERROR.value, "rid": rid, "error": rpc_error.to_json()}


def rpc_error(error: Any) -> RpcError:
    """The :class:`RpcError` an ``error`` object (as :func:`error` sent it) stands for."""
    fields = error if isinstance(error, dict) else {}
    return RpcError(
        int(fields.get("code", INTERNAL_ERROR)), str(fields.get("message", "")), fields.get("data")
    )


def client_request(
    rid: str, reply_to: str, method: str, params: JsonObject, prefer: str | None
) -> JsonObject:
    """A host's request to one client of a session (``prefer``: that connection only)."""
    return {
        "kind": SessionMessage.CLIENT_REQUEST.value,
        "rid": rid,
        "reply": reply_to,
        "method": method,
        "params": params,
        "prefer": prefer,
    }


def client_settled(rid: str) -> JsonObject:
    return {"kind": SessionMessage.CLIENT_SETTLED.value, "rid": rid}


def client_reply(rid: str, node_id: str, answer: JsonObject) -> JsonObject:
    """A front's answer: ``{"result": …}``, ``{"error": …}`` or ``{"none": True}``."""
    return {"op": Op.CLIENT_REPLY.value, "rid": rid, "node": node_id, **answer}


@dataclass(frozen=True, slots=True)
class PromptOutcome:
    """A finished prompt turn: the agent's result and where its end landed in the log."""

    result: JsonObject
    position: Position


def prompt_reply(outcome: PromptOutcome) -> JsonObject:
    """A prompt's outcome as the host's ``reply`` carries it."""
    position = outcome.position
    return {"result": outcome.result, "seq": position.seq, "epoch": position.epoch}


def prompt_outcome(reply: JsonObject) -> PromptOutcome:
    """The outcome a :func:`prompt_reply` carries."""
    return PromptOutcome(reply["result"], Position(reply["seq"], reply["epoch"]))


def outcome_from_event(event: LogEvent) -> PromptOutcome:
    """A turn's outcome read from its ``prompt_end`` event (its host may have died)."""
    body = event.body
    if "error" in body:
        raise rpc_error(body["error"])
    return PromptOutcome(
        body.get("result") or {"stopReason": body.get("stopReason")},
        Position(event.seq, event.epoch),
    )


class AgentGateway(Protocol):
    """What the ACP methods need from the agent side."""

    default_agent: str

    def kind_of(self, agent: str) -> str: ...

    def agent_capabilities(self) -> JsonObject: ...

    async def refresh_capabilities(self) -> None: ...

    def capabilities_fresh(self) -> bool:
        """Whether :meth:`refresh_capabilities` would read nothing now."""
        ...

    async def new_session(
        self,
        tenant: str,
        params: JsonObject,
        *,
        agent: str,
        kind: str,
        meta: JsonObject,
        origin: str,
    ) -> tuple[str, JsonObject]: ...

    async def fork(
        self, tenant: str, parent_id: str, params: JsonObject, *, meta: JsonObject, origin: str
    ) -> tuple[str, JsonObject, int]: ...

    async def attach(
        self, tenant: str, session_id: str, params: JsonObject, *, holder: str | None = None
    ) -> JsonObject:
        """Have an agent hold the session; ``holder``: the host its lease named when the
        caller read it (a hint, for where to ask first)."""
        ...

    async def prompt(
        self,
        tenant: str,
        session_id: str,
        params: JsonObject,
        origin: str,
        prompt_id: str | None = None,
        author: Principal | None = None,
    ) -> PromptOutcome:
        """Run a turn; ``author``: the principal who sent it (who alone may withdraw it
        while it is queued, and who must still hold ``session.write`` when its turn comes;
        None: anyone may, nothing is checked)."""
        ...

    async def cancel(
        self, tenant: str, session_id: str, activity_id: str | None = None, origin: str = ""
    ) -> None: ...

    async def close(self, tenant: str, session_id: str, origin: str) -> None: ...

    async def forward(
        self, tenant: str, session_id: str, method: str, params: JsonObject
    ) -> Any: ...

    async def release(self, tenant: str, session_id: str) -> None: ...

    async def interact(
        self,
        tenant: str,
        session_id: str,
        action: str,
        params: JsonObject,
        principal: str,
        authority: Authority | None = None,
    ) -> JsonObject:
        """List, claim, release or answer the session's pending interactions at the host
        holding it (``{}`` when none holds it: it has none). ``authority``: what a claim's
        principal holds it with (checked again by :meth:`fence`)."""
        ...

    async def fence(self, tenant: str, session_id: str) -> None:
        """A revoke changed the session's ACL: the host holding it reopens each claim whose
        holder no longer has ``session.approve`` (nothing when no host holds it)."""
        ...

    async def stop(self, tenant: str, session_id: str) -> None:
        """Have the host holding the session let its agent process go, the session
        recorded ``STOPPED`` (its log kept whole); nothing when no host holds it."""
        ...
