"""A prompt runs once per prompt id: a copy of its command (a front sent it again after a
late acknowledgement) that reaches the host while the first waits in the queue, runs, or
after it ended is not queued again, and is answered with the first's outcome. One host,
one real Redis, the demo agent as a real subprocess; no front."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from broker.protocol import commands
from broker.protocol.commands import Op, Reply
from broker.store.client import commands as raw
from broker.store.client import connect
from broker.store.events import EventType
from broker.store.keys import host_inbox, host_queue
from broker.store.log import SessionLog
from workers.agent_host.worker import HostWorker

from .conftest import make_settings
from .support.client import wait_for
from .support.redis_server import redis_server

REPLIES = "node-copies"
TENANT = "t"


async def _answers(listener: Any, wanted: dict[str, int], timeout: float = 30.0) -> list[Any]:
    """Every message ``listener`` hears until each call id of ``wanted`` has that many
    answers (replies or errors)."""
    got: list[dict[str, Any]] = []
    answered: Counter[str] = Counter()
    async with asyncio.timeout(timeout):
        while any(answered[rid] < count for rid, count in wanted.items()):
            message = await listener.get_message(timeout=1.0)
            if message is None or message["type"] != "smessage":
                continue
            reply = json.loads(message["data"])
            got.append(reply)
            if reply["t"] != Reply.ACK.value:
                answered[reply["rid"]] += 1
    return got


def _prompt(rid: str, session_id: str, prompt_id: str, words: str) -> str:
    fields = {
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": words}]},
        "origin": "test",
        "promptId": prompt_id,
        "author": "",
    }
    return commands.encode(commands.command(Op.PROMPT, rid, REPLIES, TENANT, session_id, fields))


async def test_a_prompt_sent_again_while_queued_running_or_ended_runs_once(tmp_path: Any) -> None:
    with redis_server() as url:
        admin = connect(url)
        worker = HostWorker(connect(url), make_settings())
        listener = raw(admin).pubsub()
        await listener.ssubscribe(REPLIES)
        await worker.start()
        inbox = host_inbox(worker.host_id)
        log = SessionLog(admin)

        async def facts() -> list[tuple[str, str]]:
            events = await log.read(TENANT, session_id)
            kinds = {EventType.PROMPT, EventType.PROMPT_QUEUED, EventType.PROMPT_END}
            return [(e.type, str(e.body.get("promptId"))) for e in events if e.type in kinds]

        try:
            fields = {
                "params": {"cwd": str(tmp_path), "mcpServers": []},
                "agent": "demo",
                "kind": "shell",
                "meta": {},
                "origin": "test",
            }
            new = commands.command(Op.NEW, "n#1", REPLIES, TENANT, None, fields)
            await raw(admin).xadd(host_queue(), {"m": commands.encode(new)})
            made = [m for m in await _answers(listener, {"n#1": 1}) if m["t"] == Reply.REPLY.value]
            session_id = made[0]["result"]["sessionId"]

            running = _prompt("p#1", session_id, "act-run", "/slow 3")
            waiting = _prompt("p#2", session_id, "act-wait", "/notool queued")
            await raw(admin).xadd(inbox, {"m": running})
            await wait_for(lambda: _in(facts, ("prompt", "act-run")), 20, "the first turn")
            await raw(admin).xadd(inbox, {"m": waiting})
            await wait_for(lambda: _in(facts, ("prompt_queued", "act-wait")), 20, "queued")
            # Copies of both (the same call ids): one of the running prompt, one of the
            # queued one, each sent again after an acknowledgement that came late.
            await raw(admin).xadd(inbox, {"m": running})
            await raw(admin).xadd(inbox, {"m": waiting})
            got = await _answers(listener, {"p#1": 2, "p#2": 2})
            await wait_for(lambda: _in(facts, ("prompt_end", "act-wait")), 20, "the second turn")
            # A copy that comes after the prompt ended: answered alike, not run.
            await raw(admin).xadd(inbox, {"m": waiting})
            late = await _answers(listener, {"p#2": 1})

            assert await facts() == [
                ("prompt", "act-run"),
                ("prompt_queued", "act-wait"),
                ("prompt_end", "act-run"),
                ("prompt", "act-wait"),
                ("prompt_end", "act-wait"),
            ]
            replies = [m for m in got + late if m["t"] == Reply.REPLY.value]
            for rid in ("p#1", "p#2"):
                answers = [
                    (m["result"]["seq"], m["result"]["result"]) for m in replies if m["rid"] == rid
                ]
                assert len(set(map(repr, answers))) == 1, answers
                assert answers[0][1]["stopReason"] == "end_turn"
            assert len([m for m in replies if m["rid"] == "p#2"]) == 3
        finally:
            await worker.stop()
            await worker.redis.aclose()
            await listener.aclose()
            await admin.aclose()


async def _in(facts: Any, fact: tuple[str, str]) -> bool:
    return fact in await facts()
