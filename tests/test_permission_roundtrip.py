"""An agent's question to a client is never lost: the answer that comes back before
``SPUBLISH`` returns is taken, a question nobody heard is asked again under the same id, and
one that nobody answers fails in bounded time with a clear error.

Then a permission-heavy run with no fault: a thousand prompts, each asking for a
permission, over two front nodes and two agent hosts (real processes on a real Redis), and
not one hangs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from broker.protocol.jsonrpc import RpcError
from broker.store.client import Store, commands, connect
from broker.store.keys import SessionKeys
from workers.agent_host.clients import RemoteClients

from .support.client import REPLY_WAIT, RawClient, wait_for
from .support.redis_server import redis_server
from .test_scale_out import cluster_of


class _ChannelFake:
    """A store stand-in whose SPUBLISH lets a test decide what the nodes do with a message."""

    def __init__(self, on_publish: Any) -> None:
        self.on_publish = on_publish
        self.published: list[dict[str, Any]] = []

    async def spublish(self, channel: str, data: str) -> int:
        message = json.loads(data)
        self.published.append(message)
        return int(self.on_publish(message))


_Channel: Any = _ChannelFake  # a stand-in for the Store protocol


async def test_an_answer_that_arrives_before_the_publish_returns_is_taken() -> None:
    clients: RemoteClients

    def answer_at_once(message: dict[str, Any]) -> int:
        if message["kind"] == "creq":
            clients.on_reply({"rid": message["rid"], "node": "n1", "result": {"ok": 1}})
        return 1

    clients = RemoteClients(_Channel(answer_at_once), "inbox", timeout=5, reask_interval=1)
    answer = await asyncio.wait_for(
        clients.request_client("t", "s", "session/request_permission", {}, None), 5
    )
    assert answer == {"ok": 1}
    assert clients.waiting() == 0


async def test_a_question_nobody_heard_is_asked_again_under_the_same_id() -> None:
    clients: RemoteClients
    asks: list[str] = []

    def drop_the_first(message: dict[str, Any]) -> int:
        if message["kind"] == "creq":
            asks.append(message["rid"])
            if len(asks) == 2:
                clients.on_reply({"rid": message["rid"], "node": "n1", "result": {"ok": 2}})
        return 1

    clients = RemoteClients(_Channel(drop_the_first), "inbox", timeout=5, reask_interval=0.05)
    answer = await asyncio.wait_for(
        clients.request_client("t", "s", "session/request_permission", {}, None), 5
    )
    assert answer == {"ok": 2}
    assert len(asks) == 2 and asks[0] == asks[1]


async def test_a_question_no_front_heard_yet_is_published_again_until_one_does() -> None:
    """After Redis came back, fronts subscribe again: a question published meanwhile reaches
    nobody, and once counted as "no connected client" though the client was there."""
    clients: RemoteClients
    heard: list[int] = []

    def subscribed_on_the_third(message: dict[str, Any]) -> int:
        if message["kind"] != "creq":
            return 1
        heard.append(len(heard) >= 2)
        if heard[-1]:
            clients.on_reply({"rid": message["rid"], "node": "n1", "result": {"ok": 4}})
        return int(heard[-1])

    clients = RemoteClients(_Channel(subscribed_on_the_third), "inbox", timeout=5, reask_interval=1)
    answer = await asyncio.wait_for(
        clients.request_client("t", "s", "session/request_permission", {}, None), 5
    )
    assert answer == {"ok": 4}
    assert heard == [False, False, True]


async def test_a_question_nobody_answers_fails_within_its_deadline() -> None:
    clients = RemoteClients(_Channel(lambda _: 1), "inbox", timeout=0.3, reask_interval=0.1)
    with pytest.raises(RpcError, match="no client answered session/request_permission"):
        await asyncio.wait_for(
            clients.request_client("t", "s", "session/request_permission", {}, None), 5
        )
    assert clients.waiting() == 0


async def test_every_node_declining_ends_the_question_at_once() -> None:
    clients: RemoteClients

    def decline(message: dict[str, Any]) -> int:
        if message["kind"] == "creq":
            clients.on_reply({"rid": message["rid"], "node": "n1", "none": True})
        return 1

    clients = RemoteClients(_Channel(decline), "inbox", timeout=30, reask_interval=10)
    with pytest.raises(RpcError, match="no connected client"):
        await asyncio.wait_for(clients.request_client("t", "s", "fs/read_text_file", {}, None), 5)


async def test_a_question_whose_client_went_away_waits_for_it_to_come_back() -> None:
    clients: RemoteClients
    asks = 0

    def gone_then_back(message: dict[str, Any]) -> int:
        nonlocal asks
        if message["kind"] != "creq":
            return 1
        asks += 1
        if asks == 1:  # asked, and its connection dropped before it answered
            clients.on_reply({"rid": message["rid"], "node": "n1", "none": True, "asked": True})
            return 1
        if asks < 4:
            return 0  # no node has the session while the client reconnects
        clients.on_reply({"rid": message["rid"], "node": "n2", "result": {"ok": 3}})
        return 1

    clients = RemoteClients(
        _Channel(gone_then_back), "inbox", timeout=30, reask_interval=0.05, reconnect_grace=5
    )
    answer = await asyncio.wait_for(
        clients.request_client("t", "s", "session/request_permission", {}, "conn-1"), 5
    )
    assert answer == {"ok": 3}


async def test_the_grace_is_bounded() -> None:
    clients: RemoteClients

    def gone(message: dict[str, Any]) -> int:
        if message["kind"] == "creq" and message.get("prefer"):
            clients.on_reply({"rid": message["rid"], "node": "n1", "none": True, "asked": True})
            return 1
        return 0

    clients = RemoteClients(
        _Channel(gone), "inbox", timeout=30, reask_interval=0.05, reconnect_grace=0.3
    )
    with pytest.raises(RpcError, match="no connected client"):
        await asyncio.wait_for(
            clients.request_client("t", "s", "session/request_permission", {}, "conn-1"), 5
        )


class _SocketErrorsFake:
    """A real store whose SPUBLISH fails with a bare socket error (``OSError``, which redis-py
    does not always wrap) on the first request and on the first "settled"."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.failed: set[str] = set()

    async def spublish(self, channel: str, data: str) -> int:
        kind = json.loads(data)["kind"]
        if kind not in self.failed:
            self.failed.add(kind)
            raise ConnectionResetError(104, "Connection reset by peer")
        return int(await commands(self.store).spublish(channel, data))


_SocketErrors: Any = _SocketErrorsFake  # a stand-in for the Store protocol


async def test_a_socket_error_from_the_store_is_asked_through() -> None:
    """An ``OSError`` from the store is handled as a RedisError is: the question is asked
    again at the next interval and its answer taken; one announcing "settled" is logged
    (either once escaped: the agent got the socket error instead of its client's answer)."""
    with redis_server() as url:
        store = connect(url)
        listener = commands(store).pubsub()
        await listener.ssubscribe(SessionKeys("t", "s").channel)
        clients = RemoteClients(_SocketErrors(store), "inbox", timeout=10, reask_interval=0.1)
        try:
            asking = asyncio.ensure_future(
                clients.request_client("t", "s", "session/request_permission", {}, None)
            )
            heard = await wait_for(lambda: _next_request(listener), what="the question")
            clients.on_reply({"rid": heard["rid"], "node": "n1", "result": {"ok": 3}})
            assert await asyncio.wait_for(asking, 5) == {"ok": 3}
        finally:
            await listener.aclose()
            await store.aclose()


async def _next_request(listener: Any) -> dict[str, Any] | None:
    message = await listener.get_message(timeout=0.1)
    return json.loads(message["data"]) if message and message["type"] == "smessage" else None


SESSIONS = 40
PROMPTS_EACH = 25
"""1,000 prompts in all, each asking for a permission: a count, not what a time budget
allows (a budget's count was the machine's speed: 438 under load where 1,000 was asked)."""
SOAK_BOUND = 600.0
"""Seconds the soak may take: 10 s alone, minutes on a loaded 2-core machine, where every
prompt is a front, a host and the demo agent each taking their turn on the CPUs."""


async def _drive(url: str, cwd: str, counts: dict[str, int]) -> None:
    """One connection, one session: :data:`PROMPTS_EACH` prompts one after another, allowing
    every permission. A prompt not answered within :data:`REPLY_WAIT` (past the broker's
    own request deadline, which answers a late one with an error) hung."""
    loop = asyncio.get_running_loop()
    client = await RawClient.connect(url)
    try:
        await client.initialize()
        session_id = await client.new_session(cwd, timeout=REPLY_WAIT)
        for n in range(1, PROMPTS_EACH + 1):
            prompt_id = f"p{n}"
            await client.send_prompt(prompt_id, session_id, f"read {n}")
            deadline = loop.time() + REPLY_WAIT
            try:
                while True:
                    message = await client.recv(max(0.01, deadline - loop.time()))
                    if message.get("method") == "session/request_permission":
                        counts["asked"] += 1
                        option = message["params"]["options"][0]["optionId"]
                        outcome = {"outcome": "selected", "optionId": option}
                        await client.send(
                            {"jsonrpc": "2.0", "id": message["id"], "result": {"outcome": outcome}}
                        )
                    elif message.get("id") == prompt_id and "method" not in message:
                        assert message.get("result", {}).get("stopReason") == "end_turn", message
                        counts["done"] += 1
                        break
            except TimeoutError:
                counts["hung"] += 1
                return
    finally:
        await client.close()


@pytest.mark.slow
@pytest.mark.timeout(SOAK_BOUND + 60)
async def test_thousands_of_permission_prompts_over_two_fronts_none_hangs(
    redis_url: str, tmp_path: Path
) -> None:
    async with cluster_of(redis_url, tmp_path, fronts=2, hosts=2) as deployment:
        counts = {"done": 0, "hung": 0, "asked": 0}
        async with asyncio.timeout(SOAK_BOUND):
            await asyncio.gather(
                *(
                    _drive(deployment.nodes[i % 2].url, f"/soak/{i}", counts)
                    for i in range(SESSIONS)
                )
            )
        print("permission soak:", counts)
        assert counts == {"done": SESSIONS * PROMPTS_EACH, "hung": 0, "asked": counts["asked"]}
        assert counts["asked"] >= counts["done"], counts
