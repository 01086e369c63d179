"""Agents that crash, hang or write garbage: their prompts end with a clear error, their
sessions are marked ERROR, and the broker and other agents carry on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.protocol.jsonrpc import RpcError
from broker.serve import Broker
from broker.store.client import connect
from broker.store.events import EventType
from broker.store.retry import STORE_AWAY
from workers.agent_host.host import AgentHost
from workers.agent_host.recorder import APPEND_RETRY_PAUSES
from workers.agent_host.worker import HostWorker

from .conftest import demo_agent, make_settings, plain_agent
from .support.client import LOADED_WAIT, RawClient, text, wait_for
from .support.redis_server import RestartableRedis, restartable_redis


@pytest.fixture
async def touchy_broker(store: Any) -> AsyncIterator[Broker]:
    """A broker whose agents are given little patience with a cancel (0.5 s).

    Their requests keep the default timeout: starting the demo agent (its ``initialize``)
    takes several seconds on a loaded 2-core machine, and none of these tests waits for a
    request's timeout. The first ``session/new`` starts the tenant's agent process (the
    ACP SDK's imports: 1 s idle, 17-30 s and more under the full suite), so a client's
    requests get :data:`LOADED_WAIT` rather than the default 30 s (past it the broker
    answers "try again shortly", as it should)."""
    settings = make_settings(
        agents=[demo_agent(), plain_agent()], cancel_grace=0.5, request_timeout=LOADED_WAIT
    )
    node = Broker(settings, redis=store)
    await node.start()
    yield node
    await node.stop()


async def _session(client: RawClient, agent: str = "demo") -> str:
    reply = await client.call(
        "session/new",
        {"cwd": "/tmp/f", "mcpServers": [], "_meta": {"acpBroker/agent": agent}},
        timeout=LOADED_WAIT + 5,  # the fixture's request deadline, and its error reply
    )
    assert "result" in reply, reply
    return str(reply["result"]["sessionId"])


async def _status(broker: Broker, session_id: str) -> str:
    return (await broker.log.snapshot("default", session_id)).status


@pytest.mark.parametrize("command", ["/crash", "/garbage"])
async def test_a_failing_agent_ends_its_prompts_and_marks_sessions_error(
    touchy_broker: Broker, command: str
) -> None:
    url = f"ws://127.0.0.1:{touchy_broker.port}/acp"
    client = await RawClient.initialized(url)
    doomed = await _session(client)
    bystander = await _session(client)
    other_agent = await _session(client, "plain")
    reply = await client.call("session/prompt", {"sessionId": doomed, "prompt": text(command)})
    assert reply["error"]["code"] == -32603
    assert "agent" in reply["error"]["message"]
    for session_id in (doomed, bystander):
        await wait_for_status(touchy_broker, session_id, "ERROR")
    # Another agent carries on untouched.
    ok = await client.call(
        "session/prompt", {"sessionId": other_agent, "prompt": text("still here")}
    )
    assert ok["result"]["stopReason"] == "end_turn"
    assert await _status(touchy_broker, other_agent) == "RUNNING"
    # The failed session comes back on a fresh agent process at its next prompt.
    again = await client.call(
        "session/prompt", {"sessionId": doomed, "prompt": text("/notool back")}
    )
    assert again["result"]["stopReason"] == "end_turn"
    assert await _status(touchy_broker, doomed) == "RUNNING"
    # The log says what happened to the failed prompt.
    events = await touchy_broker.log.read("default", doomed)
    ends = [e.body for e in events if e.type == "prompt_end"]
    assert "error" in ends[0] and ends[1]["stopReason"] == "end_turn"
    await client.close()


async def test_an_agent_that_ignores_cancel_is_failed_after_the_grace_period(
    touchy_broker: Broker,
) -> None:
    url = f"ws://127.0.0.1:{touchy_broker.port}/acp"
    client = await RawClient.initialized(url)
    session_id = await _session(client)
    await client.send_prompt("hang", session_id, "/hang")
    worker = touchy_broker.worker
    assert worker is not None
    await wait_for(lambda: worker.host.prompt_origin(session_id) is not None)
    await client.send(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
    )
    reply = await client.reply_to("hang", timeout=10)
    assert reply["error"]["code"] == -32603
    await wait_for_status(touchy_broker, session_id, "ERROR")
    await client.close()


async def test_cancel_settles_a_pending_permission_request(url: str) -> None:
    client = await RawClient.initialized(url)
    session_id = await _session(client)
    await client.send_prompt("p", session_id, "read it")
    await client.read_until(
        lambda: any(m.get("method") == "session/request_permission" for m in client.inbox)
    )
    [ask] = [m for m in client.inbox if m.get("method") == "session/request_permission"]
    await client.send(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
    )
    reply = await client.reply_to("p")
    assert reply["result"]["stopReason"] == "cancelled"
    # The client is told the permission request is settled (before or after the reply:
    # the agent host's word on the request and the turn's end travel apart).
    await client.read_until(
        lambda: any(m.get("method") == "$/cancel_request" for m in client.inbox)
    )
    settled = [m for m in client.inbox if m.get("method") == "$/cancel_request"]
    assert settled[0]["params"]["requestId"] == ask["id"]
    await client.close()


async def test_an_agent_that_cannot_start_gives_a_clear_error(store: Any) -> None:
    from broker.config import AgentSpec

    broken = AgentSpec(name="broken", command=["/nonexistent/agent-binary"])
    node = Broker(make_settings(agents=[broken, demo_agent()]), redis=store)
    await node.start()
    try:
        client = await RawClient.initialized(f"ws://127.0.0.1:{node.port}/acp")
        reply = await client.call("session/new", {"cwd": "/tmp/x", "mcpServers": []})
        assert reply["error"]["code"] == -32603 and "could not start" in reply["error"]["message"]
        assert (await _session(client, "demo")).startswith("sess_")
        await client.close()
    finally:
        await node.stop()


async def wait_for_status(broker: Broker, session_id: str, status: str) -> None:
    async def reached() -> bool:
        return await _status(broker, session_id) == status

    await wait_for(reached, 10.0, f"{session_id} to become {status}")


def _failed_appends(host: Any) -> list[int]:
    """Counts (in ``[0]``) the host's appends that failed because the store was away."""
    failed = [0]
    append_many = host.log.append_many

    async def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            return await append_many(*args, **kwargs)
        except STORE_AWAY:
            failed[0] += 1
            raise

    host.log.append_many = counted
    return failed


async def _agent_killed_in_an_outage(
    server: RestartableRedis, host: AgentHost, appends: int, what: str
) -> None:
    """Redis down, then the demo agent killed: Redis comes back once ``appends`` of the host's
    appends have failed every try they are given."""
    pid = host.agent_pid("demo")
    assert pid is not None
    failed = _failed_appends(host)
    server.kill()
    os.kill(pid, signal.SIGKILL)
    tries = len(APPEND_RETRY_PAUSES) + 1  # what one append is given
    await wait_for(lambda: failed[0] >= appends * tries, 30.0, what)
    server.start()


@contextlib.asynccontextmanager
async def _demo_session(tmp_path: Path) -> AsyncIterator[tuple[RestartableRedis, AgentHost, str]]:
    """A demo agent's session on an agent host over a restartable redis-server (append-only
    file on, so a restart keeps the log): the server, the host and the session's id."""
    with restartable_redis(aof=True) as server:
        store = connect(server.url, timeout=1.0)
        host = HostWorker(store, make_settings(agents=[demo_agent()])).host
        try:
            session_id, _ = await host.new_session(
                "t",
                {"cwd": str(tmp_path), "mcpServers": []},
                agent="demo",
                kind="shell",
                meta={},
                origin="test",
            )
            yield server, host, session_id
        finally:
            await host.stop()
            host.log.close()
            await store.aclose()


async def test_an_agent_that_crashes_while_the_store_is_away_marks_its_session_error_once_back(
    tmp_path: Path,
) -> None:
    """The agent dies while Redis is down, and stays down past every try of an append: its
    session is still recorded as ERROR once Redis is back (not given up on with an
    exception nobody reads, the session left RUNNING)."""
    async with _demo_session(tmp_path) as (server, host, session_id):
        await _agent_killed_in_an_outage(server, host, 1, "every try of the ERROR status")

        async def errored() -> bool:
            with contextlib.suppress(*STORE_AWAY):
                snapshot = await host.log.snapshot("t", session_id)
                return snapshot.status == "ERROR"
            return False

        await wait_for(errored, 20.0, "the session recorded as ERROR")


async def test_a_turn_that_ends_while_the_store_is_away_has_its_end_logged_once_back(
    tmp_path: Path,
) -> None:
    """The agent dies mid-turn while Redis is down, past every try of an append: the turn's
    end (its error) still reaches the log once Redis is back, so every viewer sees the turn
    end (a v2 client was answered when the prompt was logged: the log is all it hears)."""
    async with _demo_session(tmp_path) as (server, host, session_id):
        turn = asyncio.ensure_future(
            host.prompt("t", session_id, {"prompt": text("/hang")}, "test", "p1")
        )

        async def began() -> bool:
            return (await host.log.snapshot("t", session_id)).prompt_id == "p1"

        await wait_for(began, 10.0, "the prompt in the log")
        await _agent_killed_in_an_outage(server, host, 2, "every try of the turn's end")
        with pytest.raises(RpcError, match="agent"):
            await asyncio.wait_for(turn, 30.0)
        ends = [
            e.body for e in await host.log.read("t", session_id) if e.type == EventType.PROMPT_END
        ]
        assert [(b["promptId"], "agent" in b["error"]["message"]) for b in ends] == [("p1", True)]
