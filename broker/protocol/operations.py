"""Operation ids on ACP requests: which requests carry one, where, and what identifies their
input. Pure: no store, no connection (the ledger is :mod:`broker.store.operations`).

The ACP Remote drafts (``rfds-remote-multi-client-sessions``, ``-reliable-transport``; the
names are provisional) give every mutation an ``operationId``: a retry with the same id and
input returns the first outcome, never applies twice; the same id with another input is an
``operation_conflict``. A client that negotiated the draft (``capabilities.remote`` at
``initialize``) sends it as the request's ``operationId``; any client may send it as
``params._meta.operationId``. A client names its installation with ``clientInstanceId``
(the draft's ``remote.clientInstanceId`` at ``initialize``, or ``_meta.clientInstanceId``):
one principal's clients then each have ids of their own.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

from .jsonrpc import JsonObject, invalid_params
from .trace import TRACE_KEYS

OPERATION_ID: Final = "operationId"
"""The draft's name of an operation id (a request param, or a ``_meta`` key)."""
CLIENT_INSTANCE_ID: Final = "clientInstanceId"
"""The draft's name of a client installation's id (``initialize``)."""
MUTATIONS: Final = frozenset(
    {
        "session/new",
        "session/fork",
        "session/prompt",
        "session/cancel",
        "session/set_mode",
        "session/set_config_option",
        "session/set_title",
        "session/close",
        "session/delete",
        "session_access/grant",
        "session_access/revoke",
        "interaction/claim",
        "interaction/release",
        "interaction/respond",
    }
)
"""The ACP methods an operation id makes safe to send again (the ones that change state;
the draft requires one on each ``interaction/*`` change: a retried answer is answered with
the first outcome, not refused as late)."""
REPEATABLE: Final = frozenset(
    {
        "session/cancel",
        "session/set_mode",
        "session/set_config_option",
        "session/set_title",
        "session/close",
        "session/delete",
        "session_access/grant",
    }
)
"""Mutations whose second run comes out as the first did (they set a value or end a state):
one whose first request died without an outcome is run again rather than reported unknown."""
ID_RULE: Final = re.compile(r"[\x21-\x7e]{1,128}")
"""An operation id, and a client instance's: 1 to 128 visible ASCII characters."""


def operation_id(params: JsonObject, *, remote: bool) -> str | None:
    """The operation id a request carries (None: none); -32602 when malformed, or given in
    both places with two values. ``remote``: the connection negotiated the draft, whose
    requests carry it as a param of their own."""
    meta = params.get("_meta")
    in_meta = meta.get(OPERATION_ID) if isinstance(meta, dict) else None
    top = params.get(OPERATION_ID) if remote else None
    if top is not None and in_meta is not None and top != in_meta:
        raise invalid_params(f"{OPERATION_ID} and _meta.{OPERATION_ID} differ")
    value = top if top is not None else in_meta
    if value is None:
        return None
    if not isinstance(value, str) or not ID_RULE.fullmatch(value):
        raise invalid_params(f"{OPERATION_ID} must be 1 to 128 visible ASCII characters")
    return value


ACTIVITY_ID: Final = "activityId"
"""The draft's name of what a cancel targets: a prompt's id (the broker's ``promptId``)."""


def activity_id(params: JsonObject) -> str | None:
    """The activity a cancel targets (a param, or ``_meta.activityId``; None: the running
    turn, whoever's it is). A malformed one targets nothing that exists: it is a string of
    its own, logged as a late cancel."""
    meta = params.get("_meta")
    value = params.get(ACTIVITY_ID)
    if value is None and isinstance(meta, dict):
        value = meta.get(ACTIVITY_ID)
    return None if value is None else str(value)[:128]


def client_instance_id(params: JsonObject) -> str:
    """The client instance an ``initialize`` names (``""``: none); -32602 when malformed."""
    remote, meta = params.get("remote"), params.get("_meta")
    value = remote.get(CLIENT_INSTANCE_ID) if isinstance(remote, dict) else None
    if value is None and isinstance(meta, dict):
        value = meta.get(CLIENT_INSTANCE_ID)
    if value is None:
        return ""
    if not isinstance(value, str) or not ID_RULE.fullmatch(value):
        raise invalid_params(f"{CLIENT_INSTANCE_ID} must be 1 to 128 visible ASCII characters")
    return value


def negotiates_remote(client_capabilities: JsonObject) -> bool:
    """Whether a client's ``initialize`` capabilities take up the draft (``remote``)."""
    return isinstance(client_capabilities.get("remote"), dict)


def without_operation(params: JsonObject) -> JsonObject:
    """``params`` less its operation id (a new dict): what the method itself is given."""
    out = {k: v for k, v in params.items() if k != OPERATION_ID}
    meta = out.get("_meta")
    if isinstance(meta, dict) and OPERATION_ID in meta:
        rest = {k: v for k, v in meta.items() if k != OPERATION_ID}
        if rest:
            out["_meta"] = rest
        else:
            del out["_meta"]
    return out


def fingerprint(method: str, params: JsonObject) -> str:
    """What identifies an operation's input: its method and params, less the operation id
    and the trace context (a retry is traced anew), whatever the keys' order."""
    kept = without_operation(params)
    meta = kept.get("_meta")
    if isinstance(meta, dict):
        rest = {k: v for k, v in meta.items() if k not in TRACE_KEYS}
        if rest:
            kept["_meta"] = rest
        else:
            del kept["_meta"]
    return digest({"method": method, "params": kept})


def digest(value: Any) -> str:
    """A SHA-256 of ``value`` as canonical JSON (keys sorted, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
