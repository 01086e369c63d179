"""A prompt turn a client re-attaches to after its connection dropped: the wire contract.

A client may name its prompt: ``session/prompt`` with ``_meta["acpBroker/promptId"]``
(:data:`PROMPT_ID_META`) makes the broker log the turn under that id. If the connection
that sent it drops, the turn runs on at its agent host; the client reconnects, resumes the
session, and asks :data:`PROMPT_OUTCOME` ``{"sessionId", "promptId"}``: the broker answers
with what the prompt request would have been answered (the agent's result, or the error
the turn ended with) once the turn's end is in the log and every event up to it was sent
on the asking connection. The stdio bridge (``acp-broker connect``) does this for editors.
Pure: validation and the mapping of a logged turn end to the answer.
"""

from __future__ import annotations

import re
from typing import Any, Final

from .jsonrpc import INTERNAL_ERROR, JsonObject, RpcError, invalid_params

PROMPT_ID_META: Final = "acpBroker/promptId"
"""``_meta`` key of a ``session/prompt``: the id the client gives its turn."""
PROMPT_OUTCOME: Final = "_acpBroker/prompt_outcome"
"""Extension method: the answer of a named prompt, once its turn has ended."""
QUEUED_SEQ: Final = "queuedSeq"
"""Member of a ``prompt`` event whose prompt waited in the queue: the seq of its
``prompt_queued`` event, which its v2 user message (and the v2 prompt's answer, given on
acceptance into the queue) is named after."""
WITHDRAWN_META: Final = "acpBroker/withdrawn"
"""``_meta`` key (true) of the answer of a prompt withdrawn from its session's queue before
its turn: ``{"stopReason": "cancelled", "_meta": {WITHDRAWN_META: true}}``."""
WITHDRAWN: Final = {"stopReason": "cancelled", "_meta": {WITHDRAWN_META: True}}
_PROMPT_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def client_prompt_id(params: JsonObject) -> str | None:
    """The id a client gave its prompt in ``_meta`` (None: none given; -32602 if malformed)."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or PROMPT_ID_META not in meta:
        return None
    value = meta[PROMPT_ID_META]
    if not isinstance(value, str) or not _PROMPT_ID.fullmatch(value):
        raise invalid_params(f"_meta.{PROMPT_ID_META} must be 1 to 64 of A-Z a-z 0-9 _ . : -")
    return value


def outcome_query(params: JsonObject) -> tuple[str, str]:
    """The ``sessionId`` and ``promptId`` a :data:`PROMPT_OUTCOME` request names (-32602)."""
    session_id, prompt_id = params.get("sessionId"), params.get("promptId")
    if not isinstance(session_id, str) or not session_id:
        raise invalid_params("sessionId must be a non-empty string")
    if not isinstance(prompt_id, str) or not _PROMPT_ID.fullmatch(prompt_id):
        raise invalid_params("promptId must be 1 to 64 of A-Z a-z 0-9 _ . : -")
    return session_id, prompt_id


def outcome_of(prompt_end: JsonObject) -> Any:
    """The answer of a prompt request from its logged ``prompt_end`` body: the agent's
    result, or the turn's error raised as :class:`RpcError`."""
    error = prompt_end.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        message = str(error.get("message") or "the prompt turn failed")
        raise RpcError(
            code if isinstance(code, int) else INTERNAL_ERROR, message, error.get("data")
        )
    result = prompt_end.get("result")
    if isinstance(result, dict):
        return result
    return {"stopReason": prompt_end.get("stopReason") or "end_turn"}
