"""What the stdio bridge remembers so that a new WebSocket carries on where a lost one
stopped: pure, no I/O (the bridge's link in :mod:`.reconnecting` drives it).

The editor sees one agent for the bridge's whole life. So the bridge keeps:

* the editor's ``initialize`` (and ``authenticate``), sent again on every new connection;
* the sessions active on the connection (made active by a successful ``session/new``,
  ``fork``, ``load`` or ``resume``; no longer by ``close`` or ``delete``) with the position
  (``_meta["acpBroker/position"]``: seq and epoch) of the last update forwarded for each,
  so that a new connection resumes each one right after it, and an update at or before
  it (a replay overlapping what was sent) is dropped: each reaches the editor once;
* an operation id on each of the editor's mutations (``_meta.operationId``, and its client
  instance at ``initialize``), so that one sent again is never applied twice;
* the editor's requests in flight, so that each gets its real answer: a v1 prompt is
  named (``_meta["acpBroker/promptId"]``) and its outcome asked for after the drop
  (its turn runs on at its agent host); a request safe to send twice is sent again; any
  other is answered with a clear error, its outcome unknown;
* the agent's questions to the editor (``session/request_permission`` ...) still open: the
  broker asks again on the new connection, under a new id; the bridge maps it to the
  question the editor already has, so the editor is asked once, and its answer goes back
  under the id the broker asks with now (:mod:`.questions`);
* the editor's latest prompts, so that a replay after a drop does not show the editor its
  own prompt (:mod:`.echoes`).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from ..protocol.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, JsonObject
from ..protocol.operations import CLIENT_INSTANCE_ID, MUTATIONS, OPERATION_ID
from ..protocol.render import LET_GO_META, LOG_END_DATA, POSITION_META
from ..protocol.turns import PROMPT_ID_META, PROMPT_OUTCOME
from ..protocol.v2 import REPLAY_POSITION, V2
from .echoes import OwnPrompts
from .questions import Question, Questions, id_key

__all__ = [
    "BRIDGE_ID_PREFIX",
    "LOST_OUTCOME",
    "BridgeState",
    "Recovery",
    "RecoveryKind",
    "TrackedSession",
]

BRIDGE_ID_PREFIX: Final = "acp-broker-connect:"
"""Prefix of the ids of the bridge's own requests: their answers never reach the editor."""
REPLAY_AFTER_META: Final = "acpBroker/replayAfter"
"""The front's ``_meta`` key of ``session/resume``/``load``: replay after this position."""
LOST_OUTCOME: Final = INTERNAL_ERROR
"""Code of the error a request gets when its outcome was lost with the connection."""

RETRIED: Final = frozenset(
    {
        "initialize",
        "authenticate",
        "session/list",
        "session/load",
        "session/resume",
        "session/set_mode",
        "session/set_config_option",
        "session/set_title",
        "session/close",
        "session/delete",
    }
)
"""Requests sent again when their connection dropped before their answer: reads, and
writes that set a value or end a state, which come out the same when done twice."""
_ACTIVATING: Final = frozenset({"session/new", "session/fork", "session/load", "session/resume"})
_NAMED: Final = frozenset({"session/new", "session/fork"})
"""Requests sent again after a drop because their operation id makes that safe: the broker
answers the first's outcome (its session, made active on the new connection)."""
_ENDING: Final = frozenset({"session/close", "session/delete"})


@dataclass
class TrackedSession:
    """A session active on the bridge's connection and what resuming it needs."""

    session_id: str
    cwd: str
    mcp_servers: list[Any] = field(default_factory=list)


@dataclass
class EditorCall:
    """A request of the editor sent to the broker and not answered yet."""

    message: JsonObject
    link: int
    """The connection (numbered from 1) it went out on."""
    prompt_id: str | None = None

    @property
    def method(self) -> str:
        return str(self.message.get("method"))

    @property
    def params(self) -> JsonObject:
        params = self.message.get("params")
        return params if isinstance(params, dict) else {}


class RecoveryKind(Enum):
    RESEND = "resend"
    AWAIT_PROMPT = "await_prompt"
    ANSWER = "answer"  # the bridge answers it itself (an error, or what it learned)


@dataclass(frozen=True)
class Recovery:
    """What becomes of an editor request in flight when its connection dropped."""

    kind: RecoveryKind
    message: JsonObject
    """RESEND: the request again; AWAIT_PROMPT: the outcome request; ANSWER: the editor's
    reply."""
    editor_id: Any = None


@dataclass
class Routed:
    """Where a message goes: to the editor, to the broker (either may be empty)."""

    to_editor: list[JsonObject] = field(default_factory=list)
    to_broker: list[JsonObject] = field(default_factory=list)


class BridgeState:
    """The bridge's memory across connections (see the module docstring)."""

    def __init__(self) -> None:
        self.initialize: JsonObject | None = None
        self.initialized: Any = None
        """The broker's answer to the handshake's ``initialize`` on the current connection."""
        self.authenticate: JsonObject | None = None
        self.version: int | None = None
        self.link = 0
        self.client_instance = f"acp-broker-connect-{secrets.token_hex(8)}"
        """The bridge's client instance: its operation ids are its own (see
        :mod:`broker.protocol.operations`)."""
        self.sessions: dict[str, TrackedSession] = {}
        self.positions: dict[str, tuple[int, str]] = {}
        self.calls: dict[str, EditorCall] = {}  # by the JSON text of the id
        self._questions = Questions()
        self._own = OwnPrompts()
        self._ids = itertools.count(1)
        self._cancelled: set[str] = set()  # sessions whose prompt the editor cancelled

    # -- links ----------------------------------------------------------------------------

    def connected(self) -> None:
        """A new connection is up (the first one, or one after a drop)."""
        self.link += 1

    def lost(self) -> None:
        """The connection dropped: questions asked on it must be asked again to be answered,
        and each session's replay after resuming may hold the editor's own prompts."""
        self._questions.lost()
        self._own.recovering = set(self.sessions)

    @property
    def questions(self) -> dict[str, Question]:
        """The agent's questions open in the editor, by the JSON text of its id."""
        return self._questions.open

    def next_id(self) -> str:
        """An id for one of the bridge's own requests."""
        return f"{BRIDGE_ID_PREFIX}{next(self._ids)}"

    def handshake(self) -> list[JsonObject]:
        """The requests that make a new connection what the lost one was, in order (each
        answered before the next is sent): ``initialize`` and ``authenticate`` as the editor
        sent them, each under a bridge id (empty before the editor initialized)."""
        out = []
        for message in (self.initialize, self.authenticate):
            if message is not None:
                out.append({**message, "id": self.next_id()})
        return out

    def resumes(self) -> list[tuple[str, JsonObject]]:
        """A request per session active on the lost connection that makes it active again,
        replaying after the last update forwarded (all of its log when none was)."""
        return [(sid, self._resume_request(s)) for sid, s in self.sessions.items()]

    def _resume_request(self, session: TrackedSession) -> JsonObject:
        params: JsonObject = {
            "sessionId": session.session_id,
            "cwd": session.cwd,
            "mcpServers": session.mcp_servers,
        }
        position = self.positions.get(session.session_id)
        method = "session/resume"
        if self.version == V2:
            if position is None:
                params["replayFrom"] = {"type": "start"}
            else:
                seq, epoch = position
                params["replayFrom"] = {"type": REPLAY_POSITION, "seq": seq + 1, "epoch": epoch}
        elif position is None:
            method = "session/load"  # replays everything: the editor saw none of it
        else:
            seq, epoch = position
            params["_meta"] = {REPLAY_AFTER_META: {"seq": seq, "epoch": epoch}}
        return {"jsonrpc": "2.0", "id": self.next_id(), "method": method, "params": params}

    def resume_from_log_end(self, session_id: str, error: Any) -> JsonObject | None:
        """The request that resumes a session again from its log's end, when the resume was
        refused for a position ahead of the log (Redis lost the last events the editor was
        sent, in a failover): that end is taken as the last update forwarded, so what the
        log gets next reaches the editor. None for any other refusal."""
        session = self.sessions.get(session_id)
        known = self.positions.get(session_id)
        data = error.get("data") if isinstance(error, dict) else None
        end = (
            _position_of({"_meta": {POSITION_META: data.get(LOG_END_DATA)}})
            if isinstance(data, dict)
            else None
        )
        if (
            session is None
            or known is None
            or end is None
            or error.get("code") != INVALID_PARAMS
            or end[1] != known[1]
            or end[0] >= known[0]
        ):
            return None
        self.positions[session_id] = end
        return self._resume_request(session)

    def resume_failed(self, session_id: str) -> None:
        """The session could not be resumed (deleted meanwhile, say): it is no longer active."""
        self.sessions.pop(session_id, None)
        self._own.forget(session_id)

    def resumed(self, session_id: str) -> None:
        """The session is active on the new connection, its replay sent."""
        if not any(call.prompt_id for call in self._calls_of(session_id)):
            self._own.recovering.discard(session_id)

    def recoveries(self) -> list[Recovery]:
        """What becomes of each editor request that went out on an earlier connection (and
        a cancel the editor sent for a prompt still awaited: sent again, it may have been
        lost with the connection)."""
        out = []
        for key, call in list(self.calls.items()):
            if call.link == self.link:
                continue
            recovery = self._recovery(key, call)
            session_id = str(call.params.get("sessionId"))
            if recovery.kind is RecoveryKind.AWAIT_PROMPT and session_id in self._cancelled:
                cancel = {"jsonrpc": "2.0", "method": "session/cancel"}
                out.append(
                    Recovery(RecoveryKind.RESEND, {**cancel, "params": {"sessionId": session_id}})
                )
            out.append(recovery)
        return out

    def _recovery(self, key: str, call: EditorCall) -> Recovery:
        editor_id = call.message.get("id")
        if call.method == "initialize" and self.initialized is not None:
            # The handshake sent it again already: its answer is the editor's.
            del self.calls[key]
            reply = {"jsonrpc": "2.0", "id": editor_id, "result": self.initialized}
            return Recovery(RecoveryKind.ANSWER, reply, editor_id)
        if call.prompt_id is not None and call.params.get("sessionId") in self.sessions:
            call.link = self.link
            params = {"sessionId": call.params["sessionId"], "promptId": call.prompt_id}
            request = {"jsonrpc": "2.0", "id": self.next_id(), "method": PROMPT_OUTCOME}
            return Recovery(RecoveryKind.AWAIT_PROMPT, {**request, "params": params}, editor_id)
        if call.method in RETRIED or (call.method in _NAMED and operation_of(call.params)):
            call.link = self.link
            return Recovery(RecoveryKind.RESEND, self._again(call), editor_id)
        del self.calls[key]
        return Recovery(RecoveryKind.ANSWER, lost_reply(editor_id, call.method), editor_id)

    def _again(self, call: EditorCall) -> JsonObject:
        """A request sent again; a load resumes after what its lost replay forwarded."""
        position = self.positions.get(str(call.params.get("sessionId")))
        if call.method != "session/load" or position is None or self.version == V2:
            return call.message
        meta = dict(call.params.get("_meta") or {})
        meta[REPLAY_AFTER_META] = {"seq": position[0], "epoch": position[1]}
        return {**call.message, "params": {**call.params, "_meta": meta}}

    def prompt_settled(self, editor_id: Any, reply: JsonObject) -> JsonObject:
        """The editor's reply to its prompt from the answer of the outcome request."""
        call = self.calls.pop(id_key(editor_id), None)
        if call is not None:
            self._own.recovering.discard(str(call.params.get("sessionId")))
            self._cancelled.discard(str(call.params.get("sessionId")))
        out: JsonObject = {"jsonrpc": "2.0", "id": editor_id}
        if "error" in reply:
            out["error"] = reply["error"]
        else:
            out["result"] = reply.get("result")
        return out

    # -- editor -> broker -----------------------------------------------------------------

    def from_editor(self, message: Any) -> Any:
        """Note a message of the editor on its way to the broker; returns what to send
        (None: nothing now). Only single JSON objects are followed; anything else goes as
        it is (the broker answers it)."""
        if not isinstance(message, dict):
            return message
        if "method" not in message:
            return self._answer_from_editor(message)
        method = message.get("method")
        if method in MUTATIONS or method == "initialize":
            message = self._named(message)
        if "id" not in message:
            if method == "session/cancel":  # sent again after a drop while its prompt runs
                self._cancelled.add(str((message.get("params") or {}).get("sessionId")))
            return message
        if method == "initialize":
            self.initialize = message
            version = (message.get("params") or {}).get("protocolVersion")
            self.version = V2 if version == V2 else 1
        call = EditorCall(message, self.link)
        if method == "session/load" or (method == "session/resume" and "replayFrom" in call.params):
            # The editor asks for the session's history itself (a thread reopened, maybe one
            # the broker let go): the replay is all new to it, none of it a repeat to drop.
            self.positions.pop(str(call.params.get("sessionId")), None)
        if method == "session/prompt":
            call.prompt_id = secrets.token_hex(8)
            params = dict(call.params)
            params["_meta"] = {**(params.get("_meta") or {}), PROMPT_ID_META: call.prompt_id}
            call.message = {**message, "params": params}
            if self.version != V2:  # v2 shows the sender its own prompt too: no echo
                self._own.sent(str(params.get("sessionId")), params.get("prompt"))
        self.calls[id_key(message["id"])] = call
        return call.message

    def _named(self, message: JsonObject) -> JsonObject:
        """``message`` with the ids that make it safe to send again (unless the editor gave
        its own): ``initialize`` names the bridge's client instance, a mutation carries an
        operation id (``_meta``), the same on every connection it is sent on."""
        params = message.get("params")
        if not isinstance(params, dict):
            return message
        meta = params.get("_meta")
        meta = dict(meta) if isinstance(meta, dict) else {}
        if message.get("method") == "initialize":
            if "remote" in params:  # the editor speaks the draft: it names itself
                return message
            meta.setdefault(CLIENT_INSTANCE_ID, self.client_instance)
        elif operation_of(params):
            return message
        else:
            meta[OPERATION_ID] = secrets.token_hex(16)
        return {**message, "params": {**params, "_meta": meta}}

    def _answer_from_editor(self, message: JsonObject) -> JsonObject | None:
        return self._questions.answered(message, self.link)

    # -- broker -> editor -----------------------------------------------------------------

    def from_broker(self, message: Any) -> Routed:
        """Route a message of the broker (not an answer to the bridge's own requests)."""
        if not isinstance(message, dict):
            return Routed([message])
        method = message.get("method")
        if method is None:
            return Routed(self._answer_to_editor(message))
        if "id" in message:
            return self._question(message)
        if method == "$/cancel_request":
            return Routed([self._questions.withdrawn(message)])
        if method == "session/update":
            if not self._fresh_update(message):
                return Routed()
            self._let_go(message["params"])
        return Routed([message])

    def _answer_to_editor(self, message: JsonObject) -> list[JsonObject]:
        call = self.calls.pop(id_key(message.get("id")), None)
        if call is not None and call.method == "session/prompt":
            self._cancelled.discard(str(call.params.get("sessionId")))
        if call is not None and "result" in message:
            self._succeeded(call, message["result"])
        return [message]

    def _succeeded(self, call: EditorCall, result: Any) -> None:
        params, method = call.params, call.method
        if method == "authenticate":
            self.authenticate = call.message
        elif method in _ACTIVATING:
            session_id = params.get("sessionId")
            if method in ("session/new", "session/fork") and isinstance(result, dict):
                session_id = result.get("sessionId")
            cwd = params.get("cwd")
            if isinstance(session_id, str) and isinstance(cwd, str):
                servers = params.get("mcpServers")
                mcp = servers if isinstance(servers, list) else []
                self.sessions[session_id] = TrackedSession(session_id, cwd, mcp)
        elif method in _ENDING:
            session_id = str(params.get("sessionId"))
            self.sessions.pop(session_id, None)
            self.positions.pop(session_id, None)
            self._own.forget(session_id)

    def _question(self, message: JsonObject) -> Routed:
        to_editor, to_broker = self._questions.asked(message, self.link)
        return Routed(to_editor, to_broker)

    def _fresh_update(self, message: JsonObject) -> bool:
        """Whether a ``session/update`` is new to the editor (else a replay's overlap or the
        editor's own prompt replayed after a drop), noting its position."""
        params = message.get("params")
        if not isinstance(params, dict):
            return True
        session_id = str(params.get("sessionId"))
        position = _position_of(params)
        if position is None:
            return True
        seq, epoch = position
        known = self.positions.get(session_id)
        # An event may stand for several updates (a prompt's blocks): they share its seq.
        if known is not None and known[1] == epoch and seq < known[0]:
            return False
        if self._own.is_echo(session_id, seq, params.get("update")):
            self.positions[session_id] = (seq, epoch)
            return False
        self.positions[session_id] = (seq, epoch)
        return True

    def _let_go(self, params: Any) -> None:
        """A notice that the broker let the session go on this connection (to make room
        for a newer one): it is no longer active here, nor resumed after a drop."""
        update = params.get("update") if isinstance(params, dict) else None
        meta = update.get("_meta") if isinstance(update, dict) else None
        if isinstance(meta, dict) and meta.get(LET_GO_META):
            session_id = str(params.get("sessionId"))
            self.sessions.pop(session_id, None)
            self.positions.pop(session_id, None)

    def _calls_of(self, session_id: str) -> Iterator[EditorCall]:
        return (c for c in self.calls.values() if c.params.get("sessionId") == session_id)


def operation_of(params: JsonObject) -> bool:
    """Whether a request carries an operation id (a param, or in ``_meta``)."""
    meta = params.get("_meta")
    return OPERATION_ID in params or (isinstance(meta, dict) and OPERATION_ID in meta)


def lost_reply(editor_id: Any, method: str) -> JsonObject:
    """The error a request gets whose outcome was lost with the connection."""
    message = (
        f"the connection to the broker dropped before {method} was answered, and its "
        "outcome is unknown: check the session's state, then send it again if needed"
    )
    error = {"code": LOST_OUTCOME, "message": message, "data": {"acpBroker/outcomeLost": True}}
    return {"jsonrpc": "2.0", "id": editor_id, "error": error}


def _position_of(params: JsonObject) -> tuple[int, str] | None:
    meta = params.get("_meta")
    position = meta.get(POSITION_META) if isinstance(meta, dict) else None
    if not isinstance(position, dict):
        return None
    seq, epoch = position.get("seq"), position.get("epoch")
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(epoch, str):
        return None
    return seq, epoch
