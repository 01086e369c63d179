"""OpenTelemetry spans for requests, appends and fan-out, with the ``[otel]`` extra.

Without ``opentelemetry-api`` installed every function here does nothing and costs nothing.
With it, the spans go to whatever tracer provider the process configured (the SDK with an
exporter, e.g. ``opentelemetry-instrument`` or code that calls ``set_tracer_provider``); with
none configured the API's no-op tracer records nothing.

A client request's span continues the trace in its ``_meta.traceparent``/``tracestate``
(W3C trace context, as ACP's meta-propagation RFD reserves them), and what the broker sends
on to the agent carries the broker's span as parent, so an agent's own spans nest under it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ..protocol.trace import trace_fields

try:
    from opentelemetry import propagate
    from opentelemetry import trace as otel
except ImportError:  # the [otel] extra is not installed
    otel = None  # type: ignore[assignment]
    propagate = None  # type: ignore[assignment]

TRACER_NAME = "acp-broker"


def available() -> bool:
    """Whether the OpenTelemetry API is installed."""
    return otel is not None


_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
"""Whether the API would load a provider named by the environment (read once, at import)."""
_UNKNOWN = object()
_provider_set = False


def _tracing() -> bool:
    """Whether spans would go anywhere: the API is installed and a provider is set (the
    hot paths then skip even the no-op tracer's context switching).

    Asked on every request: ``get_tracer_provider()`` looks the environment up each time
    while none is set (3% of a front's CPU under a burst of reconnecting clients), so the
    API's own record of ``set_tracer_provider`` is read first when it has one; and a
    provider, once set, stays (the API refuses a second)."""
    global _provider_set
    if otel is None:
        return False
    if _provider_set:
        return True
    if getattr(otel, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_FROM_ENV:
        return False
    provider = otel.get_tracer_provider()
    _provider_set = not isinstance(provider, otel.ProxyTracerProvider | otel.NoOpTracerProvider)
    return _provider_set


def active() -> bool:
    """Whether requests are traced here (their spans go somewhere)."""
    return otel is not None and propagate is not None and _tracing()


def request_span(method: str, params: Any) -> contextlib.AbstractContextManager[dict[str, str]]:
    """A span for one client request; gives the trace context to send on to the agent
    (the client's own when nothing traces here: then no generator is made for it)."""
    incoming = trace_fields(params)
    if otel is None or propagate is None or not _tracing():
        return contextlib.nullcontext(incoming)
    return _request_span(method, incoming)


@contextlib.contextmanager
def _request_span(method: str, incoming: dict[str, str]) -> Iterator[dict[str, str]]:
    assert otel is not None and propagate is not None
    tracer = otel.get_tracer(TRACER_NAME)
    attributes = {"rpc.system": "jsonrpc", "rpc.method": method}
    with tracer.start_as_current_span(
        f"acp {method}",
        context=propagate.extract(incoming),
        kind=otel.SpanKind.SERVER,
        attributes=attributes,
    ) as span:
        if not span.get_span_context().is_valid:
            yield incoming
            return
        onward: dict[str, str] = {}
        propagate.inject(onward)
        yield {**incoming, **onward}


_UNTRACED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
"""What :func:`span` gives when nothing traces (one object for every call: it keeps nothing)."""


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """An internal span (an append, a fan-out) under the current one, if any.

    A fan-out makes one per event: when nothing traces, no generator is made for it (with
    its context manager they were ~3% of a front's CPU at S=1000/W=2, ``bench fanout``)."""
    if otel is None or not _tracing():
        return _UNTRACED
    return otel.get_tracer(TRACER_NAME).start_as_current_span(name, attributes=attributes)
