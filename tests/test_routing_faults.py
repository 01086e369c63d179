"""A front's asking of its clients for an agent under faults: a fault is answered to the
agent, not left in a task nobody reads."""

from __future__ import annotations

import json

import pytest

from broker.front.fanout import FanoutHub
from broker.front.routing import NodeRouter
from broker.protocol.commands import SessionMessage
from broker.store.client import commands, connect
from broker.store.keys import SessionKeys, host_inbox
from broker.store.log import SessionLog

from .support.redis_server import redis_server


async def test_a_fault_in_asking_a_client_is_answered_to_the_agent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client request the front cannot ask (here one with no method) is answered to the
    agent host's inbox with an error, and logged in one line (the fault once ended the ask
    with a task exception nobody read; the host heard nothing and asked again until its
    ``client_request_timeout``)."""
    with redis_server() as url:
        store = connect(url)
        hub = FanoutHub(store, SessionLog(store))
        router = NodeRouter(store, hub, agents=None)  # type: ignore[arg-type]  # not used
        inbox = host_inbox("h1")
        request = {"kind": SessionMessage.CLIENT_REQUEST.value, "rid": "h1#1", "reply": inbox}
        try:
            router.on_session_message(SessionKeys("t", "sess_1"), {**request, "params": {}})
            read = await commands(store).xread({inbox: "0"}, count=1, block=3000)
            assert read, "the agent host heard no answer"
            answer = json.loads(read[0][1][0][1]["m"])
            assert answer["rid"] == "h1#1"
            assert answer["error"]["message"] == "asking the client failed: KeyError: 'method'"
            failed = [r for r in caplog.records if "h1#1" in r.getMessage()]
            assert len(failed) == 1 and failed[0].exc_info is None
        finally:
            await store.aclose()
