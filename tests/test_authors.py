"""A prompt's author and an answer's participant are the caller's principal on every
surface: a queued prompt sent over REST or MCP is withdrawn by its author from REST, MCP or
ACP alike, and refused (``cancel_ignored``, ``not_author``) to another principal; an
interaction answered over REST or MCP names the answering principal's participant. A broker
process with authentication on; two API tokens of one tenant (Alice, Bob); httpx, the
official ``mcp`` client and a WebSocket ACP client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.protocol.interactions import participant_id
from broker.store.client import connect
from broker.store.events import EventType
from broker.store.log import SessionLog

from .support.broker_process import BrokerProcess
from .support.client import RawClient, text, tool_result_text, wait_for
from .test_security import client, http_base, secured, token

TENANT = "team-a"
CWD = "/srv/authors"
LOGGED_WITHIN = 20.0
"""Seconds for a cancel's fact to reach the log (generous: two busy cores)."""


def _auth(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def _subject(credential: str) -> str:
    """An API token's principal subject (``token:<id>``; the token is ``acpb_<id>_<secret>``)."""
    return "token:" + credential.split("_")[1]


@contextlib.asynccontextmanager
async def _two_principals(
    redis_url: str, tmp_path: Path
) -> AsyncIterator[tuple[BrokerProcess, str, str]]:
    """A broker with authentication on, and two write tokens of one tenant: Alice's, Bob's."""
    async with secured(redis_url, tmp_path) as node:
        alice = await token(redis_url, TENANT, ["read", "write"])
        bob = await token(redis_url, TENANT, ["read", "write"])
        yield node, alice, bob


@contextlib.asynccontextmanager
async def _mcp(node: BrokerProcess, credential: str) -> AsyncIterator[Client]:
    async with (
        httpx.AsyncClient(headers=_auth(credential), timeout=60) as http,
        Client(streamable_http_client(f"{http_base(node)}/mcp", http_client=http)) as mcp,
    ):
        yield mcp


async def _tool(mcp: Client, name: str, arguments: dict[str, Any]) -> str:
    result = await mcp.call_tool(name, arguments)
    assert not result.is_error, tool_result_text(result)
    return tool_result_text(result)


async def _facts(redis_url: str, session_id: str) -> list[tuple[str, str, str]]:
    """The log's queue facts: (type, activity, reason)."""
    store = connect(redis_url)
    try:
        events = await SessionLog(store).read(TENANT, session_id)
    finally:
        await store.aclose()
    kinds = (EventType.PROMPT_QUEUED, EventType.PROMPT_WITHDRAWN, EventType.CANCEL_IGNORED)
    return [
        (
            str(e.type),
            str(e.body.get("promptId") or e.body.get("activityId")),
            str(e.body.get("reason", "")),
        )
        for e in events
        if e.type in kinds
    ]


async def _logged(redis_url: str, session_id: str, fact: tuple[str, str, str]) -> None:
    async def seen() -> bool:
        return fact in await _facts(redis_url, session_id)

    await wait_for(seen, LOGGED_WITHIN, what=str(fact))


async def _window(node: BrokerProcess, credential: str, session_id: str) -> RawClient:
    """A WebSocket ACP window of ``credential``'s principal, the session loaded."""
    ws = await client(node, credential)
    reply = await ws.call("session/load", {"sessionId": session_id, "cwd": CWD, "mcpServers": []})
    assert "result" in reply, reply
    return ws


async def _cancel(ws: RawClient, session_id: str, activity: str) -> None:
    params = {"sessionId": session_id, "activityId": activity}
    await ws.send({"jsonrpc": "2.0", "method": "session/cancel", "params": params})


async def test_a_queued_prompt_is_withdrawn_by_its_author_only_from_every_surface(
    redis_url: str, tmp_path: Path
) -> None:
    async with (
        _two_principals(redis_url, tmp_path) as (node, alice, bob),
        httpx.AsyncClient(base_url=http_base(node), timeout=60) as http,
        _mcp(node, alice) as alice_mcp,
        _mcp(node, bob) as bob_mcp,
    ):
        made = await http.post("/v1/sessions", json={"cwd": CWD}, headers=_auth(alice))
        assert made.status_code == 201, made.text
        session_id = made.json()["id"]
        path = f"/v1/sessions/{session_id}"
        running = await http.post(
            f"{path}/prompt", json={"text": "/slow 300", "wait": 0.5}, headers=_auth(alice)
        )
        assert running.json()["state"] == "running", running.text
        queued = await http.post(
            f"{path}/prompt", json={"text": "/notool one", "wait": 0.2}, headers=_auth(alice)
        )
        assert queued.status_code == 202 and queued.json()["state"] == "queued", queued.text
        rest_activity = queued.json()["activityId"]
        shown = await _tool(
            alice_mcp, "session_prompt", {"id": session_id, "text": "/notool two", "wait": 0.2}
        )
        [mcp_activity] = [
            line.removeprefix("activity: ")
            for line in shown.split("\n")
            if line.startswith("activity: ")
        ]
        bob_window = await _window(node, bob, session_id)
        alice_window = await _window(node, alice, session_id)

        # Bob, on every surface: not the author; each cancel a logged no-op.
        await _cancel(bob_window, session_id, rest_activity)
        ignored = (EventType.CANCEL_IGNORED, rest_activity, "not_author")
        await _logged(redis_url, session_id, ignored)
        refused = await http.post(
            f"{path}/cancel", json={"activityId": mcp_activity}, headers=_auth(bob)
        )
        assert refused.status_code == 200 and refused.json()["stopReason"] is None
        said = await _tool(
            bob_mcp, "session_cancel", {"id": session_id, "activityId": rest_activity}
        )
        assert said.startswith("not cancelled: "), said
        facts = await _facts(redis_url, session_id)
        assert (EventType.CANCEL_IGNORED, mcp_activity, "not_author") in facts
        assert not [f for f in facts if f[0] == EventType.PROMPT_WITHDRAWN]

        # Alice withdraws the REST prompt over MCP, the MCP prompt over ACP.
        withdrawn = await _tool(
            alice_mcp, "session_cancel", {"id": session_id, "activityId": rest_activity}
        )
        assert withdrawn == "stop reason: cancelled"
        await _cancel(alice_window, session_id, mcp_activity)
        await _logged(redis_url, session_id, (EventType.PROMPT_WITHDRAWN, mcp_activity, ""))
        assert (EventType.PROMPT_WITHDRAWN, rest_activity, "") in await _facts(
            redis_url, session_id
        )
        # And an ACP prompt queued by Alice is hers to withdraw over REST.
        queued_acp = {
            "sessionId": session_id,
            "prompt": text("/notool three"),
            "_meta": {"acpBroker/promptId": "alice-acp-1"},
        }
        await alice_window.send(
            {"jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": queued_acp}
        )
        await _logged(redis_url, session_id, (EventType.PROMPT_QUEUED, "alice-acp-1", ""))
        mine = await http.post(
            f"{path}/cancel", json={"activityId": "alice-acp-1"}, headers=_auth(alice)
        )
        assert mine.json()["stopReason"] == "cancelled", mine.text
        answered = await alice_window.reply_to(9, LOGGED_WITHIN)
        assert answered["result"]["stopReason"] == "cancelled", answered
        # The running turn, cancelled: the session is quiet again.
        ended = await http.post(f"{path}/cancel", headers=_auth(alice))
        assert ended.json()["stopReason"] == "cancelled", ended.text
        await bob_window.close()
        await alice_window.close()


async def test_an_answer_over_rest_or_mcp_names_the_answering_principal(
    redis_url: str, tmp_path: Path
) -> None:
    async with _two_principals(redis_url, tmp_path) as (node, alice, bob):
        window = await client(node, alice)
        session_id = await window.new_session(CWD)
        resolvers = []
        async with (
            httpx.AsyncClient(base_url=http_base(node), timeout=60) as http,
            _mcp(node, bob) as bob_mcp,
        ):
            listed_path = f"/v1/sessions/{session_id}/interactions"

            async def pending() -> list[dict[str, Any]]:
                listed = await http.get(listed_path, headers=_auth(alice))
                return list(listed.json()["interactions"])

            for turn, answerer in ((1, "alice-rest"), (2, "bob-mcp")):
                await window.send_prompt(turn, session_id, "read it")

                [question] = await wait_for(pending, LOGGED_WITHIN, what="a question")
                if answerer == "alice-rest":
                    done = await http.post(
                        f"{listed_path}/{question['id']}/respond",
                        json={"optionId": "allow_once"},
                        headers=_auth(alice),
                    )
                    assert done.status_code == 200, done.text
                    resolvers.append(done.json()["resolvedBy"])
                else:
                    said = await _tool(
                        bob_mcp,
                        "interaction_respond",
                        {
                            "id": session_id,
                            "interactionId": question["id"],
                            "optionId": "allow_once",
                        },
                    )
                    resolvers.append(said.split("  by ")[1].split()[0])
                assert (await window.reply_to(turn, LOGGED_WITHIN))["result"]["stopReason"]
        await window.close()
    assert resolvers == [
        participant_id(session_id, _subject(alice)),
        participant_id(session_id, _subject(bob)),
    ]
