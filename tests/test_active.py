"""The sessions active on a connection, fed events with no socket and no store: what their
outbox is given, in what order, and once each."""

from __future__ import annotations

import asyncio
import json
import weakref
from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.auth.principal import Principal
from broker.front.acp.active import ActiveSessions
from broker.front.acp.lifetime import Lifetime
from broker.protocol.jsonrpc import RpcError
from broker.store.events import EventRow, LogEvent

from .conftest import make_settings

EPOCH = "e1"


def _update(seq: int, text: str) -> LogEvent:
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    return LogEvent(seq, EPOCH, 0, {"type": "update", "update": chunk})


def _row(seq: int, text: str) -> EventRow:
    return (seq, 0, json.dumps(_update(seq, text).body, separators=(",", ":")))


class RecordingOutbox:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def send_text(self, text: str, *, shared: bool = False, alone: bool = False) -> None:
        self.texts.append(text)

    def send_event(self, text: str, alone: bool = False) -> None:
        self.texts.append(text)

    def send_run(self, texts: Any) -> None:
        self.texts.extend(texts)

    def send_each_now(self, frames: Any) -> None:
        self.texts.extend(frames)

    def said(self) -> list[str]:
        """The text of each agent message chunk sent, in order."""
        return [json.loads(t)["params"]["update"]["content"]["text"] for t in self.texts]


@dataclass
class Hub:
    head: int = 0
    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)

    async def join(self, tenant: str, session_id: str, subscriber: Any) -> int:
        self.joined.append(session_id)
        return self.head

    async def leave(self, tenant: str, session_id: str, subscriber: Any) -> None:
        self.left.append(session_id)

    def deaf_to(self, tenant: str, session_id: str, subscriber: Any, kinds: frozenset[str]) -> None:
        pass  # every event here is handed to every subscriber


@dataclass
class Log:
    rows: list[EventRow] = field(default_factory=list)

    async def read_rows(
        self,
        tenant: str,
        session_id: str,
        *,
        after: int = 0,
        until: int | None = None,
        count: int | None = None,
    ) -> tuple[str, list[EventRow]]:
        rows = [r for r in self.rows if after < r[0] <= (until or r[0])]
        return EPOCH, rows[:count] if count is not None else rows


@dataclass
class Conn:
    id: str = "c1"
    protocol_version: int | None = 1
    client_capabilities: dict[str, Any] = field(default_factory=dict)
    principal: Principal | None = None
    display_name: str | None = None

    def deliver(self, session_id: str, event: LogEvent, *, alone: bool = False) -> None:
        raise AssertionError("the fake hub hands nothing out")


_CONNS: list[Conn] = []
"""The test's connections (the sessions hold theirs weakly, as a connection holds them)."""


def _sessions(hub: Hub, log: Log | None = None, **settings: Any) -> tuple[ActiveSessions, Any]:
    conn = Conn()
    _CONNS[:] = [conn]
    outbox = RecordingOutbox()
    sessions = ActiveSessions(
        weakref.ref(conn),
        make_settings(**settings),
        log or Log(),  # type: ignore[arg-type]
        hub,  # type: ignore[arg-type]
        outbox,  # type: ignore[arg-type]
        Lifetime(asyncio.get_running_loop()),
    )
    return sessions, outbox


async def test_live_events_wait_for_the_reply_then_go_in_order_once_each() -> None:
    sessions, outbox = _sessions(Hub(head=3))
    await sessions.activate("t", "s1", replay_after=None, replay_now=False)
    sessions.deliver("s1", _update(5, "five"))
    sessions.deliver("s1", _update(4, "four"))
    assert outbox.texts == []  # held: the request's reply goes first
    sessions.release("s1")
    sessions.deliver("s1", _update(5, "five again"))  # delivered already: dropped
    sessions.deliver("s1", _update(6, "six"))
    assert outbox.said() == ["four", "five", "six"]


async def test_a_load_replays_the_history_before_the_live_events() -> None:
    log = Log([_row(1, "one"), _row(2, "two")])
    sessions, outbox = _sessions(Hub(head=2), log)
    await sessions.activate("t", "s1", replay_after=0, replay_now=True)
    sessions.deliver("s1", _update(3, "three"))
    assert outbox.said() == ["one", "two"]
    sessions.release("s1")
    assert outbox.said() == ["one", "two", "three"]


async def test_a_log_whose_start_is_gone_is_lost_and_the_session_left() -> None:
    """The store dropped the log and later events made it again (its start is gone): a
    replay from before them is refused as a lost log, not a bad position."""
    hub = Hub(head=5)
    sessions, _ = _sessions(hub, Log([_row(4, "four"), _row(5, "five")]))  # its start cut
    with pytest.raises(RpcError) as refused:
        await sessions.activate("t", "s1", replay_after=1, replay_now=True)
    assert refused.value.code == -32002
    assert sessions.active == {} and hub.left == ["s1"]


async def test_a_position_in_seqs_a_rewound_log_skipped_replays_what_follows() -> None:
    """Seqs 2 and 3 were lost in a failover and never given again (store/floors.py): a
    client that saw them resumes with the events after them, and nothing is refused."""
    hub = Hub(head=5)
    sessions, outbox = _sessions(hub, Log([_row(1, "one"), _row(4, "four"), _row(5, "five")]))
    await sessions.activate("t", "s1", replay_after=2, replay_now=True)
    assert outbox.said() == ["four", "five"]
    assert "s1" in sessions.active and hub.left == []


async def test_a_waiter_resumes_once_its_event_is_sent() -> None:
    sessions, _ = _sessions(Hub(head=0))
    await sessions.activate("t", "s1", replay_after=None, replay_now=False)
    sessions.release("s1")
    waiting = asyncio.ensure_future(sessions.wait_delivered("s1", 2, timeout=5))
    await asyncio.sleep(0)
    sessions.deliver("s1", _update(1, "one"))
    await asyncio.sleep(0)
    assert not waiting.done()
    sessions.deliver("s1", _update(2, "two"))
    await asyncio.wait_for(waiting, 5)


async def test_sessions_past_the_connections_limit_are_refused() -> None:
    sessions, _ = _sessions(Hub(), max_sessions_per_connection=1)
    await sessions.activate("t", "s1", replay_after=None, replay_now=False)
    with pytest.raises(RpcError):
        await sessions.activate("t", "s2", replay_after=None, replay_now=False)
    await sessions.leave_all()
    assert sessions.active == {}
