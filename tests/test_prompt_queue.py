"""One command order per session: prompts from any window, on any front, wait their turn in
one FIFO queue; cancel targets an activity (a prompt's id). Two front nodes, one real Redis,
agents as real subprocesses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.protocol.render import QUEUE_META
from broker.protocol.turns import PROMPT_ID_META, WITHDRAWN_META
from broker.serve import Broker
from broker.store.client import commands, connect
from broker.store.events import EventType
from broker.store.keys import lease_key
from broker.store.log import SessionLog

from .support.client import RawClient, text, wait_for
from .test_interactions import ALLOW, asks
from .test_operations import CWD, _client, _resumed
from .test_operations import fronts as fronts  # the fixture: two fronts on one Redis
from .test_scale_out import _kill_holder, cluster_of


def _named(session_id: str, words: str, activity: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": text(words), "_meta": {PROMPT_ID_META: activity}}


async def _send(client: RawClient, msg_id: str, params: dict[str, Any]) -> None:
    await client.send(
        {"jsonrpc": "2.0", "id": msg_id, "method": "session/prompt", "params": params}
    )


async def _log(node: Broker, session_id: str) -> list[tuple[str, str]]:
    """The log's prompt facts: (type, activity id)."""
    events = await SessionLog(node.redis).read(node.settings.tenant, session_id)
    kinds = {
        EventType.PROMPT,
        EventType.PROMPT_QUEUED,
        EventType.PROMPT_END,
        EventType.PROMPT_WITHDRAWN,
        EventType.CANCEL_IGNORED,
    }
    return [
        (e.type, str(e.body.get("promptId") or e.body.get("activityId")))
        for e in events
        if e.type in kinds
    ]


def _queue_changes(client: RawClient, session_id: str) -> list[tuple[str, str]]:
    return [
        (u["update"]["_meta"][QUEUE_META]["change"], u["update"]["_meta"][QUEUE_META]["activityId"])
        for u in client.updates(session_id)
        if QUEUE_META in (u["update"].get("_meta") or {})
    ]


async def test_prompts_from_two_fronts_run_one_after_another_in_arrival_order(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    first = await _client(a)
    session_id = await first.new_session(CWD)
    await _send(first, "p1", _named(session_id, "/slow 3", "act-1"))
    await first.read_chunks(session_id, 1, timeout=20)
    second = await _resumed(b, session_id)
    await _send(second, "p2", _named(session_id, "/notool second", "act-2"))
    await first.read_until(lambda: len(_queue_changes(first, session_id)) >= 1, 20)
    await _send(second, "p3", _named(session_id, "/notool third", "act-3"))
    # Every attachment sees the queue: the window that did not send them too.
    await first.read_until(lambda: len(_queue_changes(first, session_id)) >= 2, 20)
    assert _queue_changes(first, session_id) == [("queued", "act-2"), ("queued", "act-3")]
    # v1: each prompt is answered at the end of its own turn.
    assert (await first.reply_to("p1", 30))["result"]["stopReason"] == "end_turn"
    assert (await second.reply_to("p2", 30))["result"]["stopReason"] == "end_turn"
    assert (await second.reply_to("p3", 30))["result"]["stopReason"] == "end_turn"
    assert await _log(a, session_id) == [
        ("prompt", "act-1"),
        ("prompt_queued", "act-2"),
        ("prompt_queued", "act-3"),
        ("prompt_end", "act-1"),
        ("prompt", "act-2"),
        ("prompt_end", "act-2"),
        ("prompt", "act-3"),
        ("prompt_end", "act-3"),
    ]
    for client in (first, second):
        await client.close()


async def test_cancel_targets_one_activity_and_a_late_cancel_is_a_recorded_no_op(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    first = await _client(a)
    session_id = await first.new_session(CWD)
    await _send(first, "run", _named(session_id, "/slow 4", "act-run"))
    await first.read_chunks(session_id, 1, timeout=20)
    second = await _resumed(b, session_id)
    await _send(second, "wait", _named(session_id, "/notool queued", "act-wait"))
    await wait_for(
        lambda: _has(a, session_id, ("prompt_queued", "act-wait")), timeout=20, what="queued"
    )
    cancel = {"sessionId": session_id, "_meta": {"activityId": "act-wait"}}
    await second.send({"jsonrpc": "2.0", "method": "session/cancel", "params": cancel})
    withdrawn = await second.reply_to("wait", 30)
    assert withdrawn["result"] == {"stopReason": "cancelled", "_meta": {WITHDRAWN_META: True}}
    # The running turn was not the target: it ends as it would have.
    assert (await first.reply_to("run", 30))["result"]["stopReason"] == "end_turn"
    # Cancelling it now, after its end: nothing happens, and the log says so.
    late = {"sessionId": session_id, "_meta": {"activityId": "act-run"}}
    await first.send({"jsonrpc": "2.0", "method": "session/cancel", "params": late})
    await wait_for(
        lambda: _has(a, session_id, ("cancel_ignored", "act-run")), timeout=20, what="late"
    )
    log = await _log(a, session_id)
    assert ("prompt", "act-wait") not in log
    assert ("prompt_withdrawn", "act-wait") in log
    # A cancel by the running turn's own id cancels it.
    await _send(first, "long", _named(session_id, "/slow 30", "act-long"))
    await wait_for(lambda: _has(a, session_id, ("prompt", "act-long")), timeout=20, what="run")
    target = {"sessionId": session_id, "_meta": {"activityId": "act-long"}}
    await second.send({"jsonrpc": "2.0", "method": "session/cancel", "params": target})
    assert (await first.reply_to("long", 30))["result"]["stopReason"] == "cancelled"
    for client in (first, second):
        await client.close()


async def _has(node: Broker, session_id: str, fact: tuple[str, str]) -> bool:
    return fact in await _log(node, session_id)


async def test_a_queued_v2_prompt_is_answered_on_acceptance_under_its_message_id(
    fronts: list[Broker],
) -> None:
    """v2: the answer comes when the prompt takes its place in the queue (the drafts'
    acceptance), with the messageId its ``user_message`` carries once its turn starts; the
    running turn's updates reach the queuing window meanwhile."""
    a, b = fronts
    first = await _client(a, version=1)
    session_id = await first.new_session(CWD)
    # The first turn runs until the test answers its agent's question: the second prompt
    # finds it running however slow the machine is.
    await _send(first, "p1", _named(session_id, "read it", "v2-1"))
    await first.read_until(lambda: asks(first), 30)
    second = await _resumed(b, session_id, version=2)
    reply = await second.call("session/prompt", _named(session_id, "/notool next", "v2-2"), 10)
    message_id = reply["result"]["messageId"]
    await first.send({"jsonrpc": "2.0", "id": asks(first)[0]["id"], "result": ALLOW})
    await first.reply_to("p1", 30)
    await wait_for(lambda: _has(a, session_id, ("prompt_end", "v2-1")), timeout=20, what="end")

    def user_messages() -> list[str]:
        return [
            u["update"]["messageId"]
            for u in second.updates(session_id)
            if u["update"]["sessionUpdate"] == "user_message"
        ]

    await second.read_until(lambda: message_id in user_messages(), 30)
    kinds = [u["update"]["sessionUpdate"] for u in second.updates(session_id)]
    # The running turn's updates reached the window that queued, before its own turn.
    assert "tool_call_update" in kinds[: kinds.index("user_message")]
    await wait_for(lambda: _has(a, session_id, ("prompt_end", "v2-2")), timeout=20, what="end")
    assert [f for f in await _log(a, session_id) if f[0] != "prompt_end"] == [
        ("prompt", "v2-1"),
        ("prompt_queued", "v2-2"),
        ("prompt", "v2-2"),
    ]
    for client in (first, second):
        await client.close()


async def test_a_prompt_queued_at_a_host_that_dies_runs_once_at_the_next(
    redis_url: str, tmp_path: Path
) -> None:
    """kill -9 the agent host holding a session while a turn runs there and a second prompt,
    sent through another front, waits in its queue: the running turn ends with an error, the
    queued prompt runs at the host that takes the session over, once, and is answered."""
    async with cluster_of(redis_url, tmp_path, fronts=2, hosts=2) as deployment:
        nodes, hosts = deployment.nodes, deployment.hosts
        first = await RawClient.initialized(nodes[0].url)
        session_id = await first.new_session(CWD)
        redis = connect(redis_url)
        holder = await commands(redis).get(lease_key("default", session_id))
        await _send(first, "run", _named(session_id, "/slow 100", "host-run"))
        await first.read_chunks(session_id, 2, 20)
        second = await RawClient.initialized(nodes[1].url)
        resumed = await second.call(
            "session/resume", {"sessionId": session_id, "cwd": CWD, "mcpServers": []}
        )
        assert "result" in resumed, resumed
        await _send(second, "wait", _named(session_id, "/notool after", "host-wait"))
        await first.read_until(lambda: _queue_changes(first, session_id), 20)
        await _kill_holder(hosts, holder)
        assert (await first.reply_to("run", 40))["error"]["code"] == -32603
        assert (await second.reply_to("wait", 60))["result"]["stopReason"] == "end_turn"
        events = await SessionLog(redis).read("default", session_id)
        started = [e.body["promptId"] for e in events if e.type == EventType.PROMPT]
        assert started == ["host-run", "host-wait"]
        await redis.aclose()
        for client in (first, second):
            await client.close()


async def test_prompts_waiting_in_the_queue_of_a_deleted_session_fail_and_never_run(
    fronts: list[Broker],
) -> None:
    a, b = fronts
    first = await _client(a)
    session_id = await first.new_session(CWD)
    await _send(first, "run", _named(session_id, "/slow 30", "del-run"))
    await first.read_chunks(session_id, 1, timeout=20)
    second = await _resumed(b, session_id)
    await _send(second, "wait", _named(session_id, "/notool never", "del-wait"))
    await wait_for(
        lambda: _has(a, session_id, ("prompt_queued", "del-wait")), timeout=20, what="queued"
    )
    assert "result" in await first.call("session/delete", {"sessionId": session_id})
    failed = await second.reply_to("wait", 30)
    assert failed["error"]["code"] == -32600 and "deleted" in failed["error"]["message"]
    assert ("prompt", "del-wait") not in await _log(a, session_id)
    for client in (first, second):
        await client.close()
