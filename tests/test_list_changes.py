"""A tenant's connections told that its session list changed (``broker/front/list_changes.py``).

The coalescing is a pure state machine, tested alone (and as a property, on a virtual
clock); the registry with fake connections on a real event loop; and the whole path end
to end: a real redis-server, a broker (front, agent host, projector) and a second front,
auth on, clients over real WebSockets whose every message is checked against the ACP
schema of their version (an extension notification a client did not ask for fails that
check). Every wait is bounded and waits for a condition.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.auth.principal import Principal
from broker.auth.tokens import TokenStore
from broker.front.list_changes import FRAME, Coalescer, ListChanges
from broker.front.node import FrontNode
from broker.protocol.capabilities import LIST_CHANGED_META, LIST_CHANGED_METHOD
from broker.serve import Broker
from broker.store.client import commands, connect

from .conftest import make_settings
from .support.client import RawClient, wait_for
from .support.nodes import running_front
from .support.schemas import _validator
from .support.wire import INIT_PARAMS, CheckedClient

ASKS = {LIST_CHANGED_META: True}


# -- the coalescing, pure ---------------------------------------------------------------------


def test_the_first_announcement_is_told_at_once_the_rest_once_at_the_window_end() -> None:
    coalescer: Coalescer[str] = Coalescer()
    assert coalescer.heard("a") is True  # idle: told now, a window opens
    assert "a" in coalescer
    assert [coalescer.heard("a") for _ in range(50)] == [False] * 50  # owed, once
    assert coalescer.heard("b") is True  # keys are apart
    assert coalescer.window_ended("a") is True  # owed: told, another window
    assert coalescer.window_ended("a") is False  # nothing since: idle
    assert "a" not in coalescer
    assert coalescer.window_ended("b") is False
    assert coalescer.heard("a") is True  # idle again: at once


def test_a_window_with_nothing_heard_ends_idle() -> None:
    coalescer: Coalescer[int] = Coalescer()
    assert coalescer.heard(1) is True
    assert coalescer.window_ended(1) is False
    assert coalescer.window_ended(1) is False  # a stray end changes nothing
    assert 1 not in coalescer


WINDOW = 10


def _simulate(announced: list[tuple[int, str]]) -> dict[str, list[int]]:
    """The times each key is told, as :class:`ListChanges` times the windows (a window's end
    comes before an announcement at the same instant)."""
    coalescer: Coalescer[str] = Coalescer()
    told: dict[str, list[int]] = {}
    ends: list[tuple[int, str]] = []
    events = sorted(announced)
    i = 0
    while i < len(events) or ends:
        if ends and (i == len(events) or ends[0][0] <= events[i][0]):
            now, key = heapq.heappop(ends)
            tell = coalescer.window_ended(key)
        else:
            now, key = events[i]
            i += 1
            tell = coalescer.heard(key)
        if tell:
            told.setdefault(key, []).append(now)
            heapq.heappush(ends, (now + WINDOW, key))
    return told


@given(st.lists(st.tuples(st.integers(0, 200), st.sampled_from("abc")), max_size=60))
def test_tellings_are_a_window_apart_and_none_is_later_than_a_window(
    announced: list[tuple[int, str]],
) -> None:
    told = _simulate(announced)
    for key, times in told.items():
        assert all(b - a >= WINDOW for a, b in itertools.pairwise(times)), times
        heard = sorted(t for t, k in announced if k == key)
        assert len(times) <= len(heard)
        for t in heard:  # every announcement is followed by a telling within a window
            assert any(t <= s <= t + WINDOW for s in times), (t, times)
    assert set(told) == {k for _, k in announced}


# -- the registry, on a real loop ---------------------------------------------------------------


@dataclass(eq=False)
class FakeConnection:
    tenant: str
    scopes: frozenset[str] = frozenset({"read"})
    asks: bool = True
    sent: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.principal: Principal | None = Principal(self.tenant, self.scopes, "token:t")
        self.client_capabilities: dict[str, Any] = {"_meta": ASKS} if self.asks else {}

    def send_text(self, text: str, *, shared: bool = False, alone: bool = False) -> None:
        assert shared  # one frame, framed once for every connection
        self.sent.append(text)


def test_the_frame_is_an_extension_notification_valid_in_v1_and_v2() -> None:
    message = json.loads(FRAME)
    assert message == {"jsonrpc": "2.0", "method": LIST_CHANGED_METHOD, "params": {}}
    assert LIST_CHANGED_METHOD.startswith("_")  # ACP's extension methods
    for version in (1, 2):
        assert not list(_validator(version, None).iter_errors(message))
        assert not list(_validator(version, "ExtNotification").iter_errors(message["params"]))


async def test_only_the_tenants_readers_that_asked_are_told() -> None:
    changes = ListChanges(window=0.05)
    told = FakeConnection("team-a")
    silent = FakeConnection("team-a", asks=False)
    other = FakeConnection("team-b")
    writer_only = FakeConnection("team-a", scopes=frozenset({"write"}))
    logged_out = FakeConnection("team-a")
    for conn in (told, silent, other, writer_only, logged_out):
        changes.follow(conn)
    logged_out.principal = None
    assert changes.listeners("team-a") == 3  # the one that did not ask is not kept
    changes.changed("team-a")
    assert told.sent == [FRAME]
    assert silent.sent == other.sent == writer_only.sent == logged_out.sent == []
    changes.changed("team-c")  # nobody here: nothing kept for it
    await wait_for(lambda: changes.listeners("team-a") and "team-a" not in changes._coalescer)
    assert "team-c" not in changes._coalescer
    changes.close()


async def test_a_burst_is_one_notification_now_and_one_at_the_window_end() -> None:
    changes = ListChanges(window=0.05)
    conn = FakeConnection("team-a")
    changes.follow(conn)
    for _ in range(100):
        changes.changed("team-a")
    assert conn.sent == [FRAME]
    await wait_for(lambda: len(conn.sent) == 2, 5)
    await wait_for(lambda: "team-a" not in changes._coalescer, 5)  # idle: nothing owed
    assert len(conn.sent) == 2
    changes.close()


async def test_a_connection_follows_its_credential_and_is_forgotten_when_it_closes() -> None:
    changes = ListChanges(window=0.05)
    conn = FakeConnection("team-a")
    changes.follow(conn)
    conn.tenant = "team-b"  # what authenticate does on a new credential
    conn.principal = Principal("team-b", frozenset({"read"}), "token:u")
    changes.follow(conn)
    assert changes.listeners("team-a") == 0 and changes.listeners("team-b") == 1
    changes.changed("team-a")
    assert conn.sent == []
    changes.changed("team-b")
    assert conn.sent == [FRAME]
    changes.discard(conn)
    changes.discard(conn)  # twice is nothing
    assert changes.listeners("team-b") == 0
    changes.close()


async def test_a_resubscription_tells_every_tenant_with_listeners() -> None:
    changes = ListChanges(window=0.05)
    a, b = FakeConnection("team-a"), FakeConnection("team-b")
    for conn in (a, b):
        changes.follow(conn)
    changes.resubscribed()
    assert a.sent == [FRAME] and b.sent == [FRAME]
    changes.close()


# -- end to end -------------------------------------------------------------------------------


@dataclass
class Deployment:
    broker: Broker
    """Front, agent host and projector in one process."""
    front: FrontNode
    """A second front, no roles beside it: told by the channel alone."""
    tokens: dict[str, str]

    def url(self, node: Broker | FrontNode) -> str:
        return f"ws://127.0.0.1:{node.port}/acp"


@contextlib.asynccontextmanager
async def _deployment(redis_url: str) -> AsyncIterator[Deployment]:
    stores = [connect(redis_url) for _ in range(3)]
    tokens = {
        tenant: (await TokenStore(stores[2]).create(tenant, ["read", "write"]))[0]
        for tenant in ("team-a", "team-b", "team-c")
    }
    try:
        async with (
            running_front(Broker(make_settings(auth="on"), redis=stores[0])) as broker,
            running_front(FrontNode(make_settings(auth="on"), redis=stores[1])) as front,
        ):
            watches = (broker.index_watch, front.index_watch)
            await wait_for(lambda: all(w.live for w in watches), 10, "the index watches")
            yield Deployment(broker, front, tokens)
    finally:
        for store in stores:
            await store.aclose()


def _told(client: CheckedClient) -> int:
    return sum(
        1 for m in client.received if isinstance(m, dict) and m.get("method") == LIST_CHANGED_METHOD
    )


async def _nothing_more(client: CheckedClient, told: int) -> None:
    """Nothing was sent to ``client`` beyond ``told`` notifications so far: a round trip on
    its connection, after which everything sent before it has been received."""
    reply = await client.call("session/list", {})  # every message received is in received
    assert "result" in reply, reply
    assert _told(client) == told, client.received


async def _read_until_told(client: CheckedClient, count: int, timeout: float = 10.0) -> None:
    await client.read_until(lambda: _told(client) >= count, timeout)


async def test_the_tenants_connections_that_asked_are_told_and_no_others(
    redis_url: str,
) -> None:
    async with _deployment(redis_url) as d:
        far = d.url(d.front)
        a_v2 = await CheckedClient.open(far, 2, meta=ASKS, token=d.tokens["team-a"])
        a_v1 = await CheckedClient.open(far, 1, meta=ASKS, token=d.tokens["team-a"])
        a_plain = await CheckedClient.open(far, 2, token=d.tokens["team-a"])
        b_v2 = await CheckedClient.open(far, 2, meta=ASKS, token=d.tokens["team-b"])
        c_v2 = await CheckedClient.open(far, 2, meta=ASKS, token=d.tokens["team-c"])
        creator = await CheckedClient.open(d.url(d.broker), 2, token=d.tokens["team-a"])

        # Another client of team-a creates a session on the other front: its own
        # projection's announcement reaches this front, which tells those that asked.
        session_id = await creator.new("/srv/push")
        for client in (a_v2, a_v1):
            await _read_until_told(client, 1)
            listed = await client.call("session/list", {})
            assert session_id in [s["sessionId"] for s in listed["result"]["sessions"]]
        await _nothing_more(a_plain, 0)
        await _nothing_more(b_v2, 0)

        # A prompt: the projector indexes its activity and announces it.
        await wait_for(lambda: "team-a" not in d.front.list_changes._coalescer, 5)
        told = _told(a_v2)
        await creator.prompt(session_id, "/notool hello")
        await _read_until_told(a_v2, told + 1)

        await _nothing_more(b_v2, 0)

        # team-b's own change is told to team-b; team-c, which asked too and whose list
        # never changed, has heard nothing of either.
        other = await CheckedClient.open(d.url(d.broker), 2, token=d.tokens["team-b"])
        await other.new("/srv/other")
        await _read_until_told(b_v2, 1)
        await _nothing_more(a_plain, 0)
        await _nothing_more(c_v2, 0)
        for client in (a_v2, a_v1, a_plain, b_v2, c_v2, creator, other):
            await client.close()


async def test_a_lost_subscription_is_caught_up_when_it_is_back(redis_url: str) -> None:
    async with _deployment(redis_url) as d:
        client = await CheckedClient.open(d.url(d.front), 2, meta=ASKS, token=d.tokens["team-a"])
        await _nothing_more(client, 0)
        # Every subscriber connection cut (as a Redis restart does): what was announced
        # meanwhile is unknown, so the front's resubscription tells its listeners.
        admin = connect(redis_url)
        try:
            await commands(admin).execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        finally:
            await admin.aclose()
        await _read_until_told(client, 1, 15)
        await wait_for(lambda: d.front.index_watch.live, 10)
        await client.close()


@pytest.mark.parametrize("version", [1, 2])
async def test_the_broker_advertises_the_extension(redis_url: str, version: int) -> None:
    async with _deployment(redis_url) as d:
        headers = {"Authorization": f"Bearer {d.tokens['team-a']}"}
        client = await RawClient.connect(d.url(d.front), additional_headers=headers)
        reply = await client.call("initialize", INIT_PARAMS[version])  # schema-checked
        result = reply["result"]
        caps = result["agentCapabilities"] if version == 1 else result["capabilities"]
        assert caps["_meta"][LIST_CHANGED_META] is True
        await client.close()
