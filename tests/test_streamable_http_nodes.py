"""No stickiness: each request of one Streamable HTTP connection goes to another front (real
processes on a real Redis), and a front killed between requests loses nothing."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.acp_http import HttpAcp, Stream, is_response
from tests.support.broker_process import BrokerProcess, broker_process

ENV = {"ACP_DEMO_TEST_COMMANDS": "1", "ACP_BROKER_HTTP_LEASE": "1.5"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def _front(
    redis_url: str, tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """A front process; its HTTP base URL."""
    port = _free_port()
    async with broker_process(
        redis_url,
        log_path=tmp_path / f"{name}.log",
        env={**ENV, **(env or {})},
        extra_args=["--http-port", str(port), *args],
        start_timeout=120,  # a loaded machine starts a node slowly
    ) as node:
        _nodes[name] = node
        yield f"http://127.0.0.1:{port}"


_nodes: dict[str, BrokerProcess] = {}


def _is_permission(message: Any) -> bool:
    return isinstance(message, dict) and message.get("method") == "session/request_permission"


async def _turn(acp: HttpAcp, stream: Stream, session_id: str, text: str) -> list[Any]:
    """A prompt allowed its permission; every event of the session stream up to its answer."""
    prompt = [{"type": "text", "text": text}]
    msg_id = await acp.request(
        "session/prompt", {"sessionId": session_id, "prompt": prompt}, session_id
    )
    events = await stream.until(_is_permission, timeout=60)
    asked = events[-1][1]
    option = asked["params"]["options"][0]["optionId"]
    answer = {
        "jsonrpc": "2.0",
        "id": asked["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": option}},
    }
    assert (await acp.post(answer, session_id)).status_code == 202
    events += await stream.until(is_response(msg_id), timeout=60)
    assert events[-1][1]["result"]["stopReason"] == "end_turn"
    return events


def _in_order_once(events: list[Any]) -> None:
    ids = [event_id for event_id, _ in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    seqs = [
        m["params"]["_meta"]["acpBroker/position"]["seq"]
        for _, m in events
        if m.get("method") == "session/update" and "_meta" in m.get("params", {})
    ]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_requests_alternate_between_two_fronts(redis_url: str, tmp_path: Path) -> None:
    async with (
        _front(redis_url, tmp_path, "a") as a,
        _front(redis_url, tmp_path, "b", "--no-workers") as b,
    ):
        acp = HttpAcp([a, b])
        try:
            await acp.initialize()  # a
            conn = await acp.open()  # b
            msg_id = await acp.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = (await conn.until(is_response(msg_id)))[-1][1]["result"]["sessionId"]
            stream = await acp.open(session_id)
            for n in range(3):
                _in_order_once(await _turn(acp, stream, session_id, f"turn {n}"))
            msg_id = await acp.request("session/list", {})
            listed = (await conn.until(is_response(msg_id)))[-1][1]["result"]["sessions"]
            assert session_id in [s["sessionId"] for s in listed]
        finally:
            await acp.aclose()


async def test_a_front_killed_between_requests_loses_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    async with (
        _front(redis_url, tmp_path, "workers") as workers,
        _front(redis_url, tmp_path, "doomed", "--no-workers") as doomed,
    ):
        acp = HttpAcp([doomed])
        try:
            await acp.initialize()
            conn = await acp.open()
            msg_id = await acp.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = (await conn.until(is_response(msg_id)))[-1][1]["result"]["sessionId"]
            stream = await acp.open(session_id)
            first = await _turn(acp, stream, session_id, "before")
            await _nodes["doomed"].kill()
            await stream.close()
            acp.bases = [workers]  # the balancer sends the client elsewhere
            again = await acp.open(session_id, last_event_id=first[-1][0])
            second = await _turn(acp, again, session_id, "after")
            _in_order_once(first + second)
        finally:
            await acp.aclose()


@pytest.fixture(autouse=True)
def _forget_nodes() -> Any:
    yield
    _nodes.clear()


async def test_a_permission_asked_when_its_front_dies_is_asked_again_on_another(
    redis_url: str, tmp_path: Path
) -> None:
    env = {"ACP_BROKER_CLIENT_REASK_INTERVAL": "1"}
    async with (
        _front(redis_url, tmp_path, "workers", env=env) as workers,
        _front(redis_url, tmp_path, "doomed", "--no-workers") as doomed,
    ):
        acp = HttpAcp([doomed])
        try:
            await acp.initialize()
            conn = await acp.open()
            msg_id = await acp.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            session_id = (await conn.until(is_response(msg_id)))[-1][1]["result"]["sessionId"]
            acp.bases = [workers]
            stream = await acp.open(session_id)  # on the front that lives
            acp.bases = [doomed]
            prompt = [{"type": "text", "text": "hello"}]
            await acp.request(
                "session/prompt", {"sessionId": session_id, "prompt": prompt}, session_id
            )
            first = (await stream.until(_is_permission, timeout=60))[-1][1]
            await _nodes["doomed"].kill()  # the front running the connection, mid-question
            # The stream's front takes the connection over; the agent asks again.
            again = (await stream.until(_is_permission, timeout=60))[-1][1]
            assert again["params"]["toolCall"] == first["params"]["toolCall"]
            acp.bases = [workers]
            option = again["params"]["options"][0]["optionId"]
            answer = {
                "jsonrpc": "2.0",
                "id": again["id"],
                "result": {"outcome": {"outcome": "selected", "optionId": option}},
            }
            assert (await acp.post(answer, session_id)).status_code == 202
            done = await stream.until(
                lambda m: (
                    m.get("method") == "session/update"
                    and m["params"]["update"].get("status") == "completed"
                ),
                timeout=60,
            )
            assert done
        finally:
            await acp.aclose()
