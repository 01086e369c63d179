"""What the stdio bridge remembers so that a new WebSocket carries on where a lost one
stopped: pure, no I/O (the bridge's link in :mod:`.reconnecting` drives it).

The editor sees one agent for the bridge's whole life. So the bridge keeps:

* the editor's ``initialize`` (and ``authenticate``), sent again on every new connection;
* the sessions active on the connection (made active by a successful ``session/new``,
  ``fork``, ``load`` or ``resume``; no longer by ``close`` or ``delete``) with the position
  (``_meta["acpBroker/position"]``: seq and epoch) of the last update forwarded for each,
  so that a new connection resumes each one right after it, and an update at or before
  it (a replay overlapping what was sent) is dropped: each reaches the editor once;
* the editor's requests in flight, so that each gets its real answer: a v1 prompt is
  named (``_meta["acpBroker/promptId"]``) and its outcome asked for after the drop
  (its turn runs on at its agent host); a request safe to send twice is sent again; any
  other is answered with a clear error, its outcome unknown;
* the agent's questions to the editor (``session/request_permission`` ...) still open: the
  broker asks again on the new connection, under a new id; the bridge maps it to the
  question the editor already has (the same method and params), so the editor is asked
  once, and its answer goes back under the id the broker asks with now.
"""

from __future__ import annotations

import itertools
import json
import secrets
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from ..protocol.jsonrpc import INTERNAL_ERROR, JsonObject
from ..protocol.render import LET_GO_META, POSITION_META
from ..protocol.turns import PROMPT_ID_META, PROMPT_OUTCOME
from ..protocol.v2 import REPLAY_POSITION, V2

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
_ENDING: Final = frozenset({"session/close", "session/delete"})
_ECHOES_KEPT: Final = 4
_ANSWERS_KEPT: Final = 64
"""Answers to the agent's questions kept, for one the broker asks again after a drop."""


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


@dataclass
class Question:
    """An agent's request to the editor, open: the id the editor knows it by, and the id
    the broker asks it by on the current connection (None: not asked again on it yet)."""

    key: str
    editor_id: Any
    broker_id: Any | None
    answer: JsonObject | None = None
    """The editor's answer, given while no connection could take it."""


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
        self.sessions: dict[str, TrackedSession] = {}
        self.positions: dict[str, tuple[int, str]] = {}
        self.calls: dict[str, EditorCall] = {}  # by the JSON text of the id
        self.questions: dict[str, Question] = {}  # by the JSON text of the editor's id
        self._echoes: dict[str, list[Any]] = {}
        self._echo_seqs: set[tuple[str, int]] = set()
        self._recovering: set[str] = set()  # sessions whose replay may echo own prompts
        self._ids = itertools.count(1)
        self._answered: OrderedDict[str, tuple[int, JsonObject]] = OrderedDict()
        self._cancelled: set[str] = set()  # sessions whose prompt the editor cancelled

    # -- links ----------------------------------------------------------------------------

    def connected(self) -> None:
        """A new connection is up (the first one, or one after a drop)."""
        self.link += 1

    def lost(self) -> None:
        """The connection dropped: questions asked on it must be asked again to be answered,
        and each session's replay after resuming may hold the editor's own prompts."""
        for question in self.questions.values():
            question.broker_id = None
        self._recovering = set(self.sessions)

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

    def resume_failed(self, session_id: str) -> None:
        """The session could not be resumed (deleted meanwhile, say): it is no longer active."""
        self.sessions.pop(session_id, None)
        self._recovering.discard(session_id)

    def resumed(self, session_id: str) -> None:
        """The session is active on the new connection, its replay sent."""
        if not any(call.prompt_id for call in self._calls_of(session_id)):
            self._recovering.discard(session_id)

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
        if call.method in RETRIED:
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
        call = self.calls.pop(_key(editor_id), None)
        if call is not None:
            self._recovering.discard(str(call.params.get("sessionId")))
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
        if "id" not in message:
            if method == "session/cancel":  # sent again after a drop while its prompt runs
                self._cancelled.add(str((message.get("params") or {}).get("sessionId")))
            return message
        if method == "initialize":
            self.initialize = message
            version = (message.get("params") or {}).get("protocolVersion")
            self.version = V2 if version == V2 else 1
        call = EditorCall(message, self.link)
        if method == "session/prompt":
            call.prompt_id = secrets.token_hex(8)
            params = dict(call.params)
            params["_meta"] = {**(params.get("_meta") or {}), PROMPT_ID_META: call.prompt_id}
            call.message = {**message, "params": params}
            if self.version != V2:  # v2 shows the sender its own prompt too: no echo
                self._remember_echo(params)
        self.calls[_key(message["id"])] = call
        return call.message

    def _answer_from_editor(self, message: JsonObject) -> JsonObject | None:
        question = self.questions.get(_key(message.get("id")))
        if question is None:
            return message
        if question.broker_id is None:  # asked again on no connection yet: kept till then
            question.answer = message
            return None
        del self.questions[_key(question.editor_id)]
        self._keep_answer(question.key, message)
        return {**message, "id": question.broker_id}

    def _keep_answer(self, key: str, answer: JsonObject) -> None:
        """Keep the editor's answer: the broker may ask again if the answer was lost with
        the connection (sent, but not yet handed to the agent when its node went)."""
        self._answered[key] = (self.link, answer)
        self._answered.move_to_end(key)
        while len(self._answered) > _ANSWERS_KEPT:
            self._answered.popitem(last=False)

    def _remember_echo(self, params: JsonObject) -> None:
        prompt = params.get("prompt")
        session_id = str(params.get("sessionId"))
        if isinstance(prompt, list) and prompt:
            echoes = self._echoes.setdefault(session_id, [])
            echoes.append(prompt[0])
            del echoes[:-_ECHOES_KEPT]

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
            return Routed(self._withdrawn(message))
        if method == "session/update":
            if not self._fresh_update(message):
                return Routed()
            self._let_go(message["params"])
        return Routed([message])

    def _answer_to_editor(self, message: JsonObject) -> list[JsonObject]:
        call = self.calls.pop(_key(message.get("id")), None)
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
            self._echoes.pop(session_id, None)

    def _question(self, message: JsonObject) -> Routed:
        key = _question_key(message)
        kept = self._answered.get(key)
        if kept is not None and kept[0] < self.link:  # answered on a lost connection
            return Routed(to_broker=[{**kept[1], "id": message["id"]}])
        for question in self.questions.values():
            if question.key == key and question.broker_id is None:
                question.broker_id = message["id"]
                if question.answer is not None:  # the editor answered meanwhile
                    del self.questions[_key(question.editor_id)]
                    self._keep_answer(key, question.answer)
                    return Routed(to_broker=[{**question.answer, "id": message["id"]}])
                return Routed()  # the editor has it already: asked once
        self.questions[_key(message["id"])] = Question(key, message["id"], message["id"])
        return Routed([message])

    def _withdrawn(self, message: JsonObject) -> list[JsonObject]:
        """The broker withdrew a question (answered elsewhere, or its turn ended): the
        editor is told under the id it knows the question by."""
        params = message.get("params")
        if not isinstance(params, dict):
            return [message]
        broker_id = params.get("requestId")
        for key, question in list(self.questions.items()):
            if question.broker_id == broker_id and question.broker_id is not None:
                del self.questions[key]
                if question.editor_id != broker_id:
                    params = {**params, "requestId": question.editor_id}
                    return [{**message, "params": params}]
                break
        return [message]

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
        if self._own_echo(session_id, seq, params.get("update")):
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
            self.sessions.pop(str(params.get("sessionId")), None)

    def _own_echo(self, session_id: str, seq: int, update: Any) -> bool:
        """Whether an update is the editor's own prompt, replayed after a drop (the broker
        echoes a prompt to every window but the one that sent it, and the new connection is
        not the one that sent it)."""
        if (session_id, seq) in self._echo_seqs:
            return True
        if session_id not in self._recovering or not isinstance(update, dict):
            return False
        if update.get("sessionUpdate") != "user_message_chunk":
            return False
        echoes = self._echoes.get(session_id) or []
        content = update.get("content")
        for index, block in enumerate(echoes):
            if block == content:
                del echoes[index]
                self._echo_seqs.add((session_id, seq))
                return True
        return False

    def _calls_of(self, session_id: str) -> Iterator[EditorCall]:
        return (c for c in self.calls.values() if c.params.get("sessionId") == session_id)


def lost_reply(editor_id: Any, method: str) -> JsonObject:
    """The error a request gets whose outcome was lost with the connection."""
    message = (
        f"the connection to the broker dropped before {method} was answered, and its "
        "outcome is unknown: check the session's state, then send it again if needed"
    )
    error = {"code": LOST_OUTCOME, "message": message, "data": {"acpBroker/outcomeLost": True}}
    return {"jsonrpc": "2.0", "id": editor_id, "error": error}


def _key(msg_id: Any) -> str:
    return json.dumps(msg_id)


def _question_key(message: JsonObject) -> str:
    """What makes an agent's question the same when asked again: its method and params
    (``_meta`` aside: trace context may differ between the two asks)."""
    params = message.get("params")
    if isinstance(params, dict):
        params = {k: v for k, v in params.items() if k != "_meta"}
    return json.dumps([message.get("method"), params], sort_keys=True)


def _position_of(params: JsonObject) -> tuple[int, str] | None:
    meta = params.get("_meta")
    position = meta.get(POSITION_META) if isinstance(meta, dict) else None
    if not isinstance(position, dict):
        return None
    seq, epoch = position.get("seq"), position.get("epoch")
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(epoch, str):
        return None
    return seq, epoch
