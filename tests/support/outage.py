"""What the store-outage tests ask of a broker process: timed requests, its lists over
ACP and REST, and whether it serves normally once the store is back."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

from .client import RawClient, text


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
