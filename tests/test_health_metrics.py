"""Health that tells the truth, and metrics that move with the traffic.

``/livez`` and ``/readyz`` on both ports (JSON with each check), ``/healthz`` an alias of
readiness; ``/metrics`` in Prometheus' text format, parsed with ``prometheus_client``'s own
parser; a role running alone serves both on its ``metrics_port``.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker.serve import Broker

from .support.client import RawClient, text, wait_for
from .support.roles import role_process
from .support.scrape import samples, total


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


async def get(url: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(_get, url)


async def test_livez_and_readyz_answer_json_with_each_check_on_both_ports(
    broker: Broker,
) -> None:
    for port in (broker.port, broker.http_port):
        status, kind, body = await get(f"http://127.0.0.1:{port}/livez")
        assert (status, json.loads(body)) == (200, {"status": "ok"}), port
        for path in ("/readyz", "/healthz"):
            status, kind, body = await get(f"http://127.0.0.1:{port}{path}")
            report = json.loads(body)
            assert status == 200 and kind.startswith("application/json"), (port, path, body)
            assert report["status"] == "ok"
            checks = report["checks"]
            expected = {"redis", "pubsub", "fanout loops", "index watch loops", "front loops"}
            expected |= {"agent host loops", "projector loop"}
            assert expected <= set(checks), checks
            assert all(check["ok"] for check in checks.values()), checks


async def test_readyz_fails_while_a_loop_fails_and_the_loop_is_restarted(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    assert broker.worker is not None
    loop = broker.worker.loops()[0]
    loop.cancel()  # not the role's stop: a failure, said and restarted
    status, _, body = await get(f"http://127.0.0.1:{broker.http_port}/readyz")
    report = json.loads(body)
    assert status == 503 and report["status"] == "unavailable", body
    assert not report["checks"]["agent host loops"]["ok"]
    assert "host-inbox failed" in report["checks"]["agent host loops"]["error"]
    assert any("loop host-inbox failed" in r.getMessage() for r in caplog.records)
    # Running again, the same task: a prompt (a command to this host's inbox) is answered.
    client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
    session_id = await client.new_session("/restarted", timeout=30)
    reply = await client.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/notool")}, timeout=30
    )
    assert reply["result"]["stopReason"] == "end_turn", reply
    await client.close()
    assert not loop.done() and broker.worker.loops()[0] is loop


async def test_a_front_loop_that_fails_is_named_and_restarted(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """The front's loops fail as the roles' do: the fan-out's pub/sub reader, cancelled by
    another hand, is named by readiness and started again on a new subscription, on which
    events reach their clients live."""
    hub = broker.hub
    [reader, _] = hub.loops()
    old = hub._live
    reader.cancel()
    status, _, body = await get(f"http://127.0.0.1:{broker.http_port}/readyz")
    checks = json.loads(body)["checks"]
    assert status == 503 and "fan-out: hub-reader failed" in checks["fanout loops"]["error"]
    assert any("loop hub-reader failed" in r.getMessage() for r in caplog.records)
    await wait_for(lambda: hub._live is not old, 10, "the reader to subscribe again")
    assert not reader.done() and hub.loops()[0] is reader
    client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
    session_id = await client.new_session("/restarted", timeout=30)
    reply = await client.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/chunks 3")}, timeout=30
    )
    assert reply["result"]["stopReason"] == "end_turn"
    assert client.chunks() == ["chunk 1", "chunk 2", "chunk 3"]
    await client.close()


async def test_metrics_parse_and_move_with_traffic(broker: Broker) -> None:
    url = f"http://127.0.0.1:{broker.http_port}/metrics"
    status, kind, body = await get(url)
    assert status == 200 and kind.startswith("text/plain"), kind
    before = samples(body)
    client = await RawClient.initialized(f"ws://127.0.0.1:{broker.port}/acp")
    session_id = await client.new_session("/metrics", timeout=30)
    reply = await client.call(
        "session/prompt", {"sessionId": session_id, "prompt": text("/chunks 20")}, timeout=30
    )
    assert reply["result"]["stopReason"] == "end_turn"
    await client.call("session/list", {})
    after = samples((await get(url))[2])
    await client.close()

    def grew(name: str, by: float = 1, **labels: str) -> None:
        assert total(after, name, **labels) - total(before, name, **labels) >= by, (name, labels)

    grew("acp_broker_events_appended_total", 20)
    grew("acp_broker_events_delivered_total", 20)
    grew("acp_broker_frames_sent_total", 20)
    grew("acp_broker_sent_bytes_total", 200)
    grew("acp_broker_request_seconds_count", method="session/prompt", outcome="ok")
    grew("acp_broker_request_seconds_count", method="session/new", outcome="ok")
    grew("acp_broker_list_seconds_count", api="acp")
    grew("acp_broker_fanout_lag_seconds_count", 20)
    grew("acp_broker_agent_starts_total")
    assert total(after, "acp_broker_connections") >= 1
    assert total(after, "acp_broker_sessions_active") >= 1
    assert total(after, "acp_broker_agent_processes") >= 1
    for name in (
        "acp_broker_catch_up_reads_total",
        "acp_broker_projector_backlog",
        "acp_broker_leases_held",
        "acp_broker_leases_taken_over_total",
        "acp_broker_closes_total",
        "acp_broker_requests_refused_total",
        "acp_broker_redis_errors_total",
        "acp_broker_redis_reconnects_total",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in (await get(url))[2], name
    # The WebSocket port serves the same page.
    status, _, body = await get(f"http://127.0.0.1:{broker.port}/metrics")
    assert status == 200 and "acp_broker_events_appended_total" in body


async def test_a_role_running_alone_serves_metrics_and_health(
    redis_url: str, tmp_path: Path
) -> None:
    env = {"ACP_BROKER_METRICS_PORT": "0"}
    for role in ("projector", "agent-host"):
        async with role_process(role, redis_url, tmp_path / f"{role}.log", env=env) as proc:
            match = re.search(r"metrics on (http://\S+)/metrics", proc.ready_line)
            assert match, proc.ready_line
            base = match.group(1)
            status, _, body = await get(f"{base}/metrics")
            assert status == 200 and "acp_broker_redis_errors_total" in body
            status, _, body = await get(f"{base}/readyz")
            assert status == 200, body
            assert json.loads(body)["checks"]["redis"]["ok"]
            assert (await get(f"{base}/livez"))[0] == 200
