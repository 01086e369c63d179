"""What the store-outage tests ask of a broker process: timed requests, its lists over
ACP and REST, and whether it serves normally once the store is back."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

from broker.ops.metrics import METRICS_PATH
from broker.store.client import commands, connect

from .client import RawClient, text, wait_for
from .projection import feeds_of, until_consumed
from .scrape import samples, total


def get_json(url: str) -> tuple[int, Any]:
    """The status and JSON body of a GET of ``url`` (an error status too)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def rest_list(http_port: int) -> tuple[int, Any]:
    """``GET /v1/sessions`` of the broker whose HTTP port is ``http_port``."""
    return await asyncio.to_thread(get_json, f"http://127.0.0.1:{http_port}/v1/sessions")


async def timed(client: RawClient, method: str, params: dict[str, object]) -> tuple[float, dict]:
    """The seconds ``client``'s request took, and its reply (bounded: 30 s)."""
    started = time.monotonic()
    reply = await client.call(method, params, timeout=30)
    return time.monotonic() - started, reply


async def kept_by_the_cache(
    client: RawClient, http_port: int, redis_url: str, session_id: str, tenant: str = "default"
) -> None:
    """Have the front's page cache keep the first page of ``session/list`` and of
    ``GET /v1/sessions`` with ``session_id`` on it, and nothing left on its way to drop them.

    A page is dropped when its tenant's index changes, and the index changes after
    ``session/new`` answers: the agent's first update (the demo agent's
    ``available_commands_update``) moves the session's ``updatedAt``, and the projectors
    announce that some tens of milliseconds later. A test that stalls the store right after
    listing may stall it before that page is read again, leaving nothing to answer from. So:
    that update received, the projectors done with the session's feed (asked of the store at
    ``redis_url``; they announce before they acknowledge), then both lists asked until the
    front answers both from its cache."""
    await client.read_until(
        lambda: any(
            u["update"]["sessionUpdate"] == "available_commands_update"
            for u in client.updates(session_id)
        )
    )
    store = connect(redis_url)
    try:
        await until_consumed(commands(store), feeds_of(tenant, [session_id]))
    finally:
        await store.aclose()

    async def both_kept() -> bool:
        hits = await _cache_hits(http_port)
        _, listed = await timed(client, "session/list", {})
        assert session_id in listed_ids(listed), listed
        status, rest = await rest_list(http_port)
        assert status == 200 and session_id in [s["id"] for s in rest["data"]], rest
        return await _cache_hits(http_port) == hits + 2

    await wait_for(both_kept, what="both lists answered from the front's page cache")


async def metrics_page(http_port: int) -> str:
    """The ``/metrics`` page of the broker whose HTTP port is ``http_port``."""
    url = f"http://127.0.0.1:{http_port}{METRICS_PATH}"
    return await asyncio.to_thread(_read_text, url)


async def _cache_hits(http_port: int) -> float:
    page = await metrics_page(http_port)
    return total(samples(page), "acp_broker_page_cache_total", outcome="hit")


def _read_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def listed_ids(listed: dict[str, Any]) -> list[str]:
    """The session ids of a ``session/list`` reply (which must be a result)."""
    assert "result" in listed, listed
    return [session["sessionId"] for session in listed["result"]["sessions"]]


async def served_again(client: RawClient, session_id: str) -> None:
    """The store is back: a new session is made and prompted, and it is listed beside
    ``session_id`` (lists read afresh, not pages held through the outage)."""
    reply = await client.call("session/new", {"cwd": "/back", "mcpServers": []}, 30)
    assert "result" in reply, reply
    back_id = reply["result"]["sessionId"]
    reply = await client.call(
        "session/prompt", {"sessionId": back_id, "prompt": text("/notool")}, 30
    )
    assert reply["result"]["stopReason"] == "end_turn", reply
    _, listed = await timed(client, "session/list", {})
    assert {session_id, back_id} <= set(listed_ids(listed)), listed
