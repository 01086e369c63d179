"""The agent host under Redis faults: it reads its command queue on, and a command the
store failed is answered with what went wrong."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from typing import Any

import pytest

from broker.config import AgentSpec
from broker.protocol import commands
from broker.protocol.commands import Op, Reply
from broker.store.client import Store, connect, server_client
from broker.store.client import commands as raw
from broker.store.keys import command_taken_key, host_queue
from workers.agent_host.taken import RUNNING_TTL_MS
from workers.agent_host.worker import HostWorker

from .conftest import demo_agent, make_settings
from .support.client import wait_for
from .support.redis_server import redis_server, restartable_redis

REPLIES = "node-test"
"""The shard channel the test's commands name for their acknowledgements and replies."""


async def _replies(listener: Any, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The next ``count`` messages ``listener`` (subscribed to :data:`REPLIES`) hears."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while len(got) < count:
            message = await listener.get_message(timeout=1.0)
            if message is not None and message["type"] == "smessage":
                got.append(json.loads(message["data"]))
    return got


async def _queue(store: Store, rid: str) -> None:
    """Put a command in the shared queue as a front does (a cancel: no agent needed)."""
    command = commands.command(Op.CANCEL, rid, REPLIES, "t", "sess_none", {})
    await raw(store).xadd(host_queue(), {"m": commands.encode(command)})


async def test_a_queued_command_whose_xack_fails_runs_and_the_queue_is_read_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis refuses the host's XACK (here an ACL without it): each command read from the
    queue is still acknowledged to its front and answered, and the host goes on reading
    the queue (an XACK error once ended that loop: no new session was served until a
    restart). The refusal is logged."""
    with redis_server() as url:
        admin: Any = connect(url)
        await admin.acl_setuser(
            "host",
            enabled=True,
            passwords=["+hostpw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-xack"],
        )
        store = connect(url.replace("redis://", "redis://host:hostpw@"))
        worker = HostWorker(store, make_settings())
        listener = admin.pubsub()
        await listener.ssubscribe(REPLIES)
        await worker.start()
        try:
            for rid in ("q#1", "q#2"):
                await _queue(admin, rid)
                got = await _replies(listener, 2)
                assert [(m["t"], m["rid"]) for m in got] == [
                    (Reply.ACK.value, rid),
                    (Reply.REPLY.value, rid),
                ]
            assert not any(loop.done() for loop in worker.loops())
            assert "acknowledging queued commands failed: StoreForbidden: " in caplog.text
        finally:
            await worker.stop()
            await listener.aclose()
            await store.aclose()
            await admin.aclose()


async def test_a_command_whose_store_is_away_tells_its_client_so() -> None:
    """The store goes away under a command the host runs (here an attach, which reads the
    session's snapshot): its client is answered that the store is unreachable, to try
    again, not "internal error"."""
    with restartable_redis(aof=False) as server:
        store = connect(server.url, timeout=1.0)
        worker = HostWorker(store, make_settings())
        sent: list[dict[str, Any]] = []

        async def send(channel: str, message: dict[str, Any]) -> None:
            sent.append(message)  # the reply path is Redis too: kept here instead

        worker._send = send  # type: ignore[method-assign]
        try:
            server.kill()
            command = commands.command(Op.ATTACH, "n#1", REPLIES, "t", "sess_1", {"params": {}})
            await asyncio.wait_for(worker._execute(command), 30.0)
            assert [m["t"] for m in sent] == [Reply.ACK.value, Reply.ERROR.value]
            assert sent[1]["error"]["message"].startswith("the session store is unreachable")
        finally:
            await store.aclose()


async def test_a_new_session_sent_again_after_a_late_acknowledgement_is_made_once(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A front sends a command again when its acknowledgement does not come within
    ``ack_timeout``; when the first copy was only late, two hosts reading the shared queue
    each get one (or one host reads both, in one batch: a loaded host not blocked in its
    read when they came). The session is made once: acknowledged by one host, one
    session in the replies, and the copy is not run (it made a second, orphaned session
    before)."""
    caplog.set_level(logging.INFO, logger="workers.agent_host.worker")
    with redis_server() as url:
        admin = connect(url)
        workers = [HostWorker(connect(url), make_settings()) for _ in range(2)]
        listener = raw(admin).pubsub()
        await listener.ssubscribe(REPLIES)
        for worker in workers:
            await worker.start()
        try:
            fields = {
                "params": {"cwd": str(tmp_path), "mcpServers": []},
                "agent": "demo",
                "kind": "shell",
                "meta": {},
                "origin": "test",
            }
            command = commands.encode(commands.command(Op.NEW, "n#7", REPLIES, "t", None, fields))
            for _ in range(2):  # the first copy, and the one sent again
                await raw(admin).xadd(host_queue(), {"m": command})
            got: list[dict[str, Any]] = []
            async with asyncio.timeout(30.0):  # up to the reply: after one or two acks
                while Reply.REPLY.value not in [m["t"] for m in got]:
                    got += await _replies(listener, 1, timeout=30.0)
            await wait_for(
                lambda: any(
                    f"command n#7 {fate}" in caplog.text
                    for fate in ("is run by another host", "was answered already", "is run here")
                ),
                10.0,
                "the copy not run",
            )
            for _ in range(2):  # whatever more comes (a reply sent again to the copy)
                got += await _replies_for(listener, 0.5)
            # Acknowledged by one host (again for a copy that host read too: its front waits
            # for an acknowledgement), and the one session's reply (sent again to a copy
            # that came once it was answered: the front takes the first).
            assert len({m["host"] for m in got if m["t"] == Reply.ACK.value}) == 1
            made = {m["result"]["sessionId"] for m in got if m["t"] == Reply.REPLY.value}
            assert len(made) == 1
        finally:
            for worker in workers:
                await worker.stop()
                await worker.redis.aclose()
            await listener.aclose()
            await admin.aclose()


def _new_session_command(rid: str, cwd: str, agent: str = "demo") -> str:
    fields = {
        "params": {"cwd": cwd, "mcpServers": []},
        "agent": agent,
        "kind": "shell",
        "meta": {},
        "origin": "test",
    }
    return commands.encode(commands.command(Op.NEW, rid, REPLIES, "t", None, fields))


async def test_a_copy_of_an_answered_new_session_gets_its_reply_again(tmp_path: Any) -> None:
    """The reply to a session/new may reach no front (Redis restarting): the front sends the
    command again, and the copy is answered with the reply kept, not skipped until the
    request's deadline (nor run a second time)."""
    with redis_server() as url:
        admin = connect(url)
        worker = HostWorker(connect(url), make_settings())
        listener = raw(admin).pubsub()
        await listener.ssubscribe(REPLIES)
        await worker.start()
        try:
            command = _new_session_command("n#8", str(tmp_path))
            await raw(admin).xadd(host_queue(), {"m": command})
            first = [m for m in await _replies(listener, 2, 30.0) if m["t"] == Reply.REPLY.value]
            await raw(admin).xadd(host_queue(), {"m": command})
            [again] = await _replies(listener, 1, 10.0)
            assert again["t"] == Reply.REPLY.value
            assert again["result"]["sessionId"] == first[0]["result"]["sessionId"]
            assert len(worker.host.held_sessions()) == 1
        finally:
            await worker.stop()
            await worker.redis.aclose()
            await listener.aclose()
            await admin.aclose()


async def test_a_new_session_whose_runner_stopped_is_run_by_the_next_copy(tmp_path: Any) -> None:
    """A host that took a session/new keeps a short mark on it while it runs (a host killed
    mid-run leaves a mark that lapses within seconds, not one that skipped every copy until
    the request's deadline), and a host whose run was cancelled (stopping) removes its
    mark: the next copy the front sends is run by another host."""
    mute = AgentSpec(name="slow", command=[sys.executable, "-c", "import time; time.sleep(60)"])
    with redis_server() as url:
        admin: Any = connect(url)  # PTTL, beyond the Store protocol
        stuck = HostWorker(connect(url), make_settings(agents=[mute]))
        able = HostWorker(connect(url), make_settings(agents=[demo_agent("slow")]))
        listener = admin.pubsub()
        await listener.ssubscribe(REPLIES)
        await stuck.start()
        key = command_taken_key("n#9")
        command = _new_session_command("n#9", str(tmp_path), agent="slow")
        try:
            await admin.xadd(host_queue(), {"m": command})
            [ack] = await _replies(listener, 1, 10.0)
            assert ack["t"] == Reply.ACK.value
            assert 0 < await admin.pttl(key) <= RUNNING_TTL_MS
            await stuck.stop()
            assert not await admin.exists(key)
            await able.start()
            await admin.xadd(host_queue(), {"m": command})
            got = await _replies(listener, 2, 30.0)
            assert [m["t"] for m in got] == [Reply.ACK.value, Reply.REPLY.value]
            assert got[1]["result"]["sessionId"]
        finally:
            await able.stop()
            for worker in (stuck, able):
                await worker.redis.aclose()
            await listener.aclose()
            await admin.aclose()


async def _replies_for(listener: Any, seconds: float) -> list[dict[str, Any]]:
    """Whatever more ``listener`` hears within ``seconds`` (none expected)."""
    got: list[dict[str, Any]] = []
    with contextlib.suppress(TimeoutError):
        got += await _replies(listener, 1, timeout=seconds)
    return got


MALFORMED = [
    {"m": "{not json"},
    {"x": "no m field"},
    {"m": "[1, 2]"},
    {"m": commands.encode({"op": Op.CANCEL.value, "rid": "bad#1", "reply": REPLIES})},
]
"""Entries no front writes: bad JSON, no ``m``, not an object, no tenant (only the last
says where to answer)."""


@pytest.mark.parametrize("stream", ["inbox", "queue"])
async def test_a_malformed_entry_is_skipped_and_the_next_command_served(
    stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Malformed entries in the host's inbox or the shared queue are logged, one line each,
    the one that names its reply channel is answered with an error, and the command after
    them is served (one such entry once ended the host's reading of that stream)."""
    with redis_server() as url:
        store = connect(url)
        worker = HostWorker(store, make_settings())
        key = worker.inbox if stream == "inbox" else host_queue()
        listener = raw(store).pubsub()
        await listener.ssubscribe(REPLIES)
        await worker.start()
        try:
            # The inbox is read from "$": write only once the host waits on it.
            await wait_for(lambda: _reading_inbox(store), what="the host reading its inbox")
            for fields in MALFORMED:
                await raw(store).xadd(key, fields)
            good = commands.command(Op.CANCEL, "good#1", REPLIES, "t", "sess_none", {})
            await raw(store).xadd(key, {"m": commands.encode(good)})
            got = await _replies(listener, 3)
            # Each is sent from its own task: only the good command's two come in order.
            assert sorted((m["rid"], m["t"]) for m in got) == [
                ("bad#1", Reply.ERROR.value),
                ("good#1", Reply.ACK.value),
                ("good#1", Reply.REPLY.value),
            ]
            assert [m["t"] for m in got if m["rid"] == "good#1"] == ["ack", "reply"]
            refusal = next(m for m in got if m["rid"] == "bad#1")["error"]["message"]
            assert refusal == "malformed command: ValueError: no tenant (a string)"
            assert not any(loop.done() for loop in worker.loops())
            skipped = [r for r in caplog.records if "skipped malformed entry" in r.getMessage()]
            assert len(skipped) == len(MALFORMED)
            assert all(r.exc_info is None and "\n" not in r.getMessage() for r in skipped)
        finally:
            await worker.stop()
            await listener.aclose()
            await store.aclose()


async def _reading_inbox(store: Store) -> bool:
    """Whether a client is blocked in XREAD (only the host's inbox is read so)."""
    return any(client["cmd"] == "xread" for client in await server_client(store).client_list())
