"""The agent's questions to the editor, across the stdio bridge's connections: pure.

An agent's request (``session/request_permission`` ...) reaches the editor under the id the
broker asked it by. When the connection drops, the broker asks again on the new one, under
a new id; :class:`Questions` maps it to the question the editor already has (the same
method and params, ``_meta`` aside), so the editor is asked once, and sends the editor's
answer under the id the broker asks by now: an answer given while no connection asked is
kept until one does, and an answer that may have been lost with its connection answers
the broker's next ask.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from ..protocol.jsonrpc import JsonObject

__all__ = ["Question", "Questions", "id_key"]

ANSWERS_KEPT: Final = 64
"""Answers kept, for a question the broker asks again after a drop."""


@dataclass
class Question:
    """A question open in the editor: the id the editor knows it by, and the id the broker
    asks it by on the current connection (None: not asked again on it yet)."""

    key: str
    editor_id: Any
    broker_id: Any | None
    answer: JsonObject | None = None
    """The editor's answer, given while no connection could take it."""


class Questions:
    """The questions open in the editor, and the answers given lately."""

    def __init__(self) -> None:
        self.open: dict[str, Question] = {}  # by the JSON text of the editor's id
        self._answered: OrderedDict[str, tuple[int, JsonObject]] = OrderedDict()

    def lost(self) -> None:
        """The connection dropped: each open question must be asked again to be answered."""
        for question in self.open.values():
            question.broker_id = None

    def asked(self, message: JsonObject, link: int) -> tuple[list[JsonObject], list[JsonObject]]:
        """A question from the broker on connection ``link``: what goes to the editor and
        what goes back to the broker (an answer the editor gave already)."""
        key = question_key(message)
        kept = self._answered.get(key)
        if kept is not None and kept[0] < link:  # answered on a lost connection
            return [], [{**kept[1], "id": message["id"]}]
        for question in self.open.values():
            if question.key == key and question.broker_id is None:
                question.broker_id = message["id"]
                if question.answer is None:
                    return [], []  # the editor has it already: asked once
                del self.open[id_key(question.editor_id)]  # the editor answered meanwhile
                self._keep(key, question.answer, link)
                return [], [{**question.answer, "id": message["id"]}]
        self.open[id_key(message["id"])] = Question(key, message["id"], message["id"])
        return [message], []

    def answered(self, message: JsonObject, link: int) -> JsonObject | None:
        """The editor's response ``message``: what to send the broker (None: nothing now;
        a response to no question goes as it is)."""
        question = self.open.get(id_key(message.get("id")))
        if question is None:
            return message
        if question.broker_id is None:  # asked again on no connection yet: kept till then
            question.answer = message
            return None
        del self.open[id_key(question.editor_id)]
        self._keep(question.key, message, link)
        return {**message, "id": question.broker_id}

    def withdrawn(self, message: JsonObject) -> JsonObject:
        """The broker withdrew a question (``$/cancel_request``: answered elsewhere, or its
        turn ended): what the editor is told, under the id it knows the question by."""
        params = message.get("params")
        if not isinstance(params, dict):
            return message
        broker_id = params.get("requestId")
        for key, question in list(self.open.items()):
            if question.broker_id is not None and question.broker_id == broker_id:
                del self.open[key]
                if question.editor_id != broker_id:
                    return {**message, "params": {**params, "requestId": question.editor_id}}
                break
        return message

    def _keep(self, key: str, answer: JsonObject, link: int) -> None:
        """Keep an answer sent on ``link``: the broker asks again if it was lost with the
        connection (sent, but not yet handed to the agent when its node went)."""
        self._answered[key] = (link, answer)
        self._answered.move_to_end(key)
        while len(self._answered) > ANSWERS_KEPT:
            self._answered.popitem(last=False)


def id_key(msg_id: Any) -> str:
    """A JSON-RPC id as a dict key (``1`` and ``"1"`` differ)."""
    return json.dumps(msg_id)


def question_key(message: JsonObject) -> str:
    """What makes an agent's question the same when asked again: its method and params
    (``_meta`` aside: trace context may differ between the two asks)."""
    params = message.get("params")
    if isinstance(params, dict):
        params = {k: v for k, v in params.items() if k != "_meta"}
    return json.dumps([message.get("method"), params], sort_keys=True)
