"""W3C trace context in ``_meta`` (ACP's meta-propagation RFD): a client's ``traceparent``
and ``tracestate`` reach the agent, are not kept as session metadata, and, with the
``[otel]`` extra and a tracer provider, the broker's spans (request, append, fan-out)
continue the client's trace and become the agent's parent. Spans are read back with the
SDK's in-memory exporter."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from broker.protocol.trace import trace_fields, with_trace, without_trace
from broker.serve import Broker

from .support.client import RawClient, text

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
TRACESTATE = "vendor=opaque"

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracer_provider() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)  # once per process: the API refuses a second


def test_trace_fields_are_root_keys_of_meta() -> None:
    params: dict[str, Any] = {"_meta": {"traceparent": TRACEPARENT, "otel": {"x": 1}, "a": 1}}
    assert trace_fields(params) == {"traceparent": TRACEPARENT}
    assert without_trace(params["_meta"]) == {"otel": {"x": 1}, "a": 1}
    assert with_trace({"cwd": "/"}, {"tracestate": "k=v"}) == {
        "cwd": "/",
        "_meta": {"tracestate": "k=v"},
    }
    assert trace_fields({"_meta": {"traceparent": 7}}) == {}


async def test_a_clients_trace_reaches_the_agent_under_the_brokers_spans(
    broker: Broker,
) -> None:
    EXPORTER.clear()
    client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
    meta = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE, "acpBroker/agent": "plain"}
    reply = await client.call(
        "session/new", {"cwd": "/trace", "mcpServers": [], "_meta": meta}, timeout=30
    )
    session_id = reply["result"]["sessionId"]
    reply = await client.call(
        "session/prompt",
        {"sessionId": session_id, "prompt": text("/trace"), "_meta": meta},
        timeout=30,
    )
    assert reply["result"]["stopReason"] == "end_turn", reply
    [said] = [
        m["params"]["update"]["content"]["text"]
        for m in client.inbox
        if m.get("method") == "session/update"
        and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
        and "new=" in m["params"]["update"]["content"]["text"]
    ]
    await client.close()
    # The agent got the trace (the same trace id; the broker's span as parent) and the state.
    new, prompt = (part.split("=", 1)[1] for part in said.split(" "))
    for seen in (new, prompt):
        parent, state = seen.split(";")
        version, trace_id, span_id, flags = parent.split("-")
        assert (version, trace_id, flags) == ("00", TRACE_ID, "01"), seen
        assert span_id != PARENT_ID, "the agent's parent is the broker's span"
        assert state == TRACESTATE
    # Propagation, not data: the session's metadata does not keep it.
    snapshot = await broker.log.snapshot("default", session_id)
    assert "traceparent" not in (snapshot.meta or {}), snapshot.meta

    spans = EXPORTER.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    [prompt_span] = by_name["acp session/prompt"]
    assert format(prompt_span.context.trace_id, "032x") == TRACE_ID
    assert prompt_span.parent is not None
    assert format(prompt_span.parent.span_id, "016x") == PARENT_ID
    assert prompt_span.attributes["rpc.method"] == "session/prompt"
    assert format(prompt_span.context.span_id, "016x") == prompt.split(";")[0].split("-")[2]
    assert by_name.get("acp-broker append"), sorted(by_name)
    assert by_name.get("acp-broker fanout"), sorted(by_name)


async def test_a_traced_rename_keeps_the_trace_out_of_the_sessions_metadata(
    broker: Broker,
) -> None:
    """A traced front adds its trace context to every request's ``_meta``: a
    ``session/set_title`` patch must not store it, and ``_meta: null`` must still clear."""
    client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
    reply = await client.call(
        "session/new",
        {"cwd": "/trace", "mcpServers": [], "_meta": {"acpBroker/agent": "plain"}},
        timeout=30,
    )
    session_id = reply["result"]["sessionId"]
    for params, meta in (
        ({"title": "t", "_meta": {"team": "x", "traceparent": TRACEPARENT}}, {"team": "x"}),
        ({"title": "u"}, {"team": "x"}),
        ({"_meta": None}, {}),
    ):
        reply = await client.call("session/set_title", {"sessionId": session_id, **params})
        assert "result" in reply, reply
        snapshot = await broker.log.snapshot("default", session_id)
        assert (snapshot.meta or {}) == meta, (params, snapshot.meta)
    await client.close()
