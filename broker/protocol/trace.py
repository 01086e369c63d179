"""W3C trace context in ``_meta``, as ACP's meta-propagation RFD reserves it.

``params._meta.traceparent``, ``tracestate`` and ``baggage`` are root keys of ``_meta``
(never nested under a vendor key), so that ACP and MCP instrumentation read the same
fields. The broker passes them from a client's request to the agent (and an agent's own
on its requests to the client) untouched, unless it traces itself (the ``[otel]`` extra,
:mod:`broker.ops.tracing`): then the agent gets the broker's span as parent. They are
propagation, not data: ``session/new`` does not keep them in the session's metadata.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from .jsonrpc import JsonObject

TRACE_KEYS = ("traceparent", "tracestate", "baggage")


def trace_fields(params: Any) -> dict[str, str]:
    """The trace context in ``params._meta`` (string values only)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict):
        return {}
    return {key: meta[key] for key in TRACE_KEYS if isinstance(meta.get(key), str)}


def without_trace(meta: JsonObject) -> JsonObject:
    """``meta`` less its trace context (what a session keeps as its metadata)."""
    return {key: value for key, value in meta.items() if key not in TRACE_KEYS}


def with_trace(params: JsonObject, fields: dict[str, str]) -> JsonObject:
    """``params`` with ``fields`` as root keys of its ``_meta`` (a new dict; None: as is).

    A ``_meta`` given as ``null`` stays ``null``: it means something of its own (clear the
    session's metadata, in ``session/set_title``), which a trace context must not undo."""
    if not fields or ("_meta" in params and params["_meta"] is None):
        return params
    meta = params.get("_meta")
    merged = {**(meta if isinstance(meta, dict) else {}), **fields}
    return {**params, "_meta": merged}
