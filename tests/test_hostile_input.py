"""Hostile and malformed traffic over a real WebSocket, on both stores.

A bad message gets an error on its own connection (or nothing, where JSON-RPC
says so) and changes nothing else: after each one, the same connection (where
it must survive) and a second connection still work.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from .support.client import RawClient, text

TEST_TIMEOUT = 20.0
QUICK = 5.0  # how long to wait for a reply that must come promptly

MiB = 1024 * 1024
MISSING = "sess_" + "0" * 32  # the shape of a session id, of no session


def bounded(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Run an async test under one overall deadline."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        await asyncio.wait_for(test(*args, **kwargs), TEST_TIMEOUT)

    return run


async def assert_broker_healthy(url: str) -> None:
    """A fresh connection can initialize and list sessions."""
    client = await RawClient.connect(url)
    try:
        init = await client.initialize()
        assert init["result"]["protocolVersion"] == 1, init
        listed = await client.call("session/list", {}, timeout=QUICK)
        assert isinstance(listed["result"]["sessions"], list), listed
    finally:
        await client.close()


async def ready_client(url: str) -> RawClient:
    client = await RawClient.connect(url)
    init = await client.initialize()
    assert "result" in init, init
    return client


async def still_answers(client: RawClient) -> None:
    """The connection answers a request, and nothing unexpected came before the answer."""
    reply = await client.call("session/list", {}, timeout=QUICK)
    assert "result" in reply, reply
    assert client.inbox == [], client.inbox


def assert_error(reply: dict[str, Any], code: int, msg_id: Any) -> None:
    assert reply.get("jsonrpc") == "2.0", reply
    assert "result" not in reply, reply
    assert reply["id"] == msg_id, reply
    assert reply["error"]["code"] == code, reply
    assert isinstance(reply["error"]["message"], str), reply


async def raw_request(client: RawClient, msg_id: Any, method: str, params: Any) -> dict[str, Any]:
    await client.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    return await client.reply_to(msg_id, QUICK)


# -- the connection state machine -------------------------------------------------------------


@bounded
async def test_request_before_initialize_is_refused_and_the_connection_lives(url: str) -> None:
    client = await RawClient.connect(url)
    reply = await client.call("session/list", {}, timeout=QUICK)
    assert reply["error"]["code"] == -32600 and reply["id"] == client.next_id, reply
    reply = await client.call("session/new", {"cwd": "/tmp/x", "mcpServers": []}, timeout=QUICK)
    assert "error" in reply, reply
    # a notification before initialize gets no reply
    await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}})
    init = await client.initialize()
    assert init["result"]["protocolVersion"] == 1, init
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_initialize_twice_is_an_error(url: str) -> None:
    client = await ready_client(url)
    again = await client.initialize()
    assert_error(again, -32600, client.next_id)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
@pytest.mark.parametrize("version", [None, "1", -1, True, 1.5])
async def test_initialize_with_a_bad_protocol_version(url: str, version: Any) -> None:
    client = await RawClient.connect(url)
    params = {} if version is None else {"protocolVersion": version}
    reply = await client.call("initialize", params, timeout=QUICK)
    assert_error(reply, -32602, client.next_id)
    assert "result" in await client.initialize()  # not initialized by the failed attempt
    await client.close()
    await assert_broker_healthy(url)


# -- framing ----------------------------------------------------------------------------------


@bounded
async def test_invalid_json_is_a_parse_error_with_null_id(url: str) -> None:
    client = await ready_client(url)
    for garbage in ["{", "not json at all", '{"jsonrpc":"2.0","id":1,', ""]:
        await client.send(garbage)
        assert_error(await client.recv(QUICK), -32700, None)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
@pytest.mark.parametrize(
    "payload",
    ["[]", "[1,2,3]", '[{"jsonrpc":"2.0","id":1,"method":"session/list"}]', "42", '"x"', "null"],
)
async def test_non_object_frames_are_invalid_requests(url: str, payload: str) -> None:
    client = await ready_client(url)
    await client.send(payload)
    assert_error(await client.recv(QUICK), -32600, None)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_wrong_jsonrpc_version_and_bad_ids(url: str) -> None:
    client = await ready_client(url)
    await client.send({"jsonrpc": "1.0", "id": 5, "method": "session/list"})
    assert_error(await client.recv(QUICK), -32600, 5)
    await client.send({"id": 6, "method": "session/list"})
    assert_error(await client.recv(QUICK), -32600, 6)
    for bad_id in [1.5, True, {"a": 1}, [7]]:
        await client.send({"jsonrpc": "2.0", "id": bad_id, "method": "session/list"})
        assert_error(await client.recv(QUICK), -32600, None)
    # Numbers no peer could echo exactly are ids JSON-RPC does not allow: -32600, not -32602.
    for bad_id_text in ["1e999", "-1E+400", "123456789012345678901234"]:
        await client.send(f'{{"jsonrpc":"2.0","id":{bad_id_text},"method":"session/list"}}')
        assert_error(await client.recv(QUICK), -32600, None)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_params_not_an_object(url: str) -> None:
    client = await ready_client(url)
    reply = await raw_request(client, 77, "session/list", [1, 2])
    assert_error(reply, -32602, 77)
    # the same as a notification: no reply at all
    await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": [1]})
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_unknown_method_is_method_not_found_with_the_same_id(url: str) -> None:
    client = await ready_client(url)
    for msg_id in [31, "str-id", 0]:
        reply = await raw_request(client, msg_id, "no/such_method", {})
        assert_error(reply, -32601, msg_id)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_unknown_notification_gets_no_reply(url: str) -> None:
    client = await ready_client(url)
    for method in ["no/such_notification", "_vendor/whatever", "session/new"]:
        await client.send({"jsonrpc": "2.0", "method": method, "params": {"x": 1}})
    await still_answers(client)  # the first thing to come back is the list's reply
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_stray_responses_get_no_reply(url: str) -> None:
    client = await ready_client(url)
    await client.send({"jsonrpc": "2.0", "id": 999_999, "result": {"ok": True}})
    await client.send({"jsonrpc": "2.0", "id": "nope", "error": {"code": -1, "message": "x"}})
    await client.send({"jsonrpc": "2.0", "id": None, "result": 1})
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_duplicate_request_id_in_flight_does_not_break_the_connection(url: str) -> None:
    client = await ready_client(url)
    request = {"jsonrpc": "2.0", "id": 5, "method": "session/list", "params": {}}
    await client.send(request)
    await client.send(request)
    replies = [await client.recv(QUICK), await client.recv(QUICK)]
    assert all(r["id"] == 5 for r in replies), replies
    assert any("result" in r for r in replies), replies
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_binary_frames_are_ignored(url: str) -> None:
    client = await RawClient.connect(url)
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": 1},
    }
    await client.send(json.dumps(initialize).encode())
    await client.send(b"\x00\xff\xfe garbage")
    # the binary initialize did nothing: the text one is the first and succeeds
    assert "result" in await client.initialize()
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


# -- sizes and depth --------------------------------------------------------------------------


@bounded
async def test_message_over_max_message_bytes_is_refused_and_the_connection_lives(
    url: str,
) -> None:
    client = await ready_client(url)
    padding = "x" * (5 * MiB)
    await client.send(
        {"jsonrpc": "2.0", "id": 3, "method": "session/list", "params": {"pad": padding}}
    )
    assert_error(await client.recv(QUICK), -32600, None)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_frame_over_max_frame_bytes_closes_only_that_connection(url: str) -> None:
    bystander = await ready_client(url)
    victim = await ready_client(url)
    huge = "x" * (17 * MiB)
    try:
        await victim.send(huge)
        await victim.recv(QUICK)
    except ConnectionClosed:
        pass
    else:
        raise AssertionError("the broker answered an oversized frame instead of closing")
    await asyncio.wait_for(victim.ws.wait_closed(), QUICK)
    assert victim.ws.close_code == 1009, (victim.ws.close_code, victim.ws.close_reason)
    await still_answers(bystander)
    await assert_broker_healthy(url)
    await bystander.close()


@bounded
@pytest.mark.parametrize("shape", ["array", "object", "in-params"])
async def test_deeply_nested_json_is_an_error_not_a_crash(url: str, shape: str) -> None:
    client = await ready_client(url)
    depth = 10_000
    if shape == "array":
        payload = "[" * depth + "]" * depth
    elif shape == "object":
        payload = '{"a":' * depth + "1" + "}" * depth
    else:
        payload = (
            '{"jsonrpc":"2.0","id":1,"method":"session/list","params":{"x":'
            + "[" * depth
            + "]" * depth
            + "}}"
        )
    await client.send(payload)
    reply = await client.recv(QUICK)
    assert reply["error"]["code"] in (-32700, -32600), reply
    assert reply["id"] is None, reply
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_nesting_just_past_max_json_depth_is_an_invalid_request(url: str) -> None:
    client = await ready_client(url)
    nested: Any = 1
    for _ in range(70):
        nested = [nested]
    await client.send(
        {"jsonrpc": "2.0", "id": 4, "method": "session/list", "params": {"x": nested}}
    )
    assert_error(await client.recv(QUICK), -32600, None)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


# -- method params ----------------------------------------------------------------------------


@bounded
@pytest.mark.parametrize(
    "params",
    [
        {"cwd": "relative/path", "mcpServers": []},
        {"cwd": "", "mcpServers": []},
        {"mcpServers": []},
        {"cwd": 42, "mcpServers": []},
        {"cwd": ["/tmp"], "mcpServers": []},
        {"cwd": "/tmp/x", "mcpServers": [], "additionalDirectories": "/tmp/y"},
        {"cwd": "/tmp/x", "mcpServers": [], "additionalDirectories": ["relative"]},
        {"cwd": "/tmp/x", "mcpServers": [], "additionalDirectories": ["/ok", 5]},
        {"cwd": "/" + "d" * 4096, "mcpServers": []},  # longer than any path can be
        {"cwd": "/tmp/x", "mcpServers": {"a": 1}},
        {"cwd": "/tmp/x", "mcpServers": "none"},
        {"cwd": "/tmp/x", "mcpServers": [], "_meta": "x"},
        {"cwd": "/tmp/x", "mcpServers": [], "_meta": {"acpBroker/agent": 5}},
        {"cwd": "/tmp/x", "mcpServers": [], "_meta": {"acpBroker/kind": "spaceship"}},
    ],
)
async def test_session_new_with_bad_params_is_invalid_params(
    url: str, params: dict[str, Any]
) -> None:
    client = await ready_client(url)
    reply = await client.call("session/new", params, timeout=QUICK)
    assert_error(reply, -32602, client.next_id)
    listed = await client.call("session/list", {}, timeout=QUICK)
    assert listed["result"]["sessions"] == [], listed  # nothing was created
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_session_methods_on_sessions_not_active_here(url: str) -> None:
    client = await ready_client(url)
    cases = [
        ("session/prompt", {"sessionId": MISSING, "prompt": text("hi")}, -32002),
        ("session/set_mode", {"sessionId": MISSING, "modeId": "code"}, -32002),
        ("session/close", {"sessionId": MISSING}, -32002),
        ("session/load", {"sessionId": MISSING, "cwd": "/tmp", "mcpServers": []}, -32002),
        ("session/resume", {"sessionId": MISSING, "cwd": "/tmp"}, -32002),
        ("session/set_title", {"sessionId": MISSING, "title": "x"}, -32002),
        # Not an id the broker makes: refused as such, whatever it would name.
        ("session/prompt", {"sessionId": "sess_nope", "prompt": text("hi")}, -32602),
        ("session/delete", {"sessionId": "x:s:" + MISSING}, -32602),
        ("session/load", {"sessionId": MISSING.upper(), "cwd": "/tmp"}, -32602),
        ("session/prompt", {"prompt": text("hi")}, -32602),
        ("session/prompt", {"sessionId": 5, "prompt": text("hi")}, -32602),
        ("session/load", {"sessionId": "", "cwd": "/tmp", "mcpServers": []}, -32602),
        ("session/delete", {"sessionId": ["x"]}, -32602),
    ]
    for method, params, code in cases:
        reply = await client.call(method, params, timeout=QUICK)
        assert_error(reply, code, client.next_id)
    # a cancel for a session that is not active here is a silent no-op
    await client.send(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "sess_nope"}}
    )
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"cwd": "relative"}, -32602),
        ({"cwd": 7}, -32602),
        ({"cwd": "/" + "d" * 4096}, -32602),  # the listings' caches keep no such key
        ({"cursor": 123}, -32602),
        ({"cursor": ["x"]}, -32602),
        ({"cursor": "garbage"}, -32602),
        ({"cursor": "eyJwIjoiMCIsImYiOiJ4In0.AAAAAAAAAAAAAAAAAAAAAA"}, -32602),
        ({"cursor": ""}, -32602),
    ],
)
async def test_session_list_with_bad_params(url: str, params: dict[str, Any], code: int) -> None:
    client = await ready_client(url)
    reply = await client.call("session/list", params, timeout=QUICK)
    assert_error(reply, code, client.next_id)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


# -- hostile input that must not take the connection down ----------------------------------


@bounded
async def test_cancel_request_with_an_unhashable_request_id_keeps_the_connection(
    url: str,
) -> None:
    """``$/cancel_request`` with ``requestId`` a list or object must be ignored.

    ``ClientConnection._cancel_request`` looks the id up in a dict, which
    raises TypeError for a list/dict, out of ``_on_frame`` and the read loop:
    the connection dies (close 1011).
    """
    client = await ready_client(url)
    for request_id in [[1], {"a": 1}]:
        await client.send(
            {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request_id}}
        )
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_lone_surrogate_in_an_echoed_id_keeps_the_connection(url: str) -> None:
    """``"\\ud800"`` is a valid JSON string; answering it must not break the connection.

    ``jsonrpc.encode`` writes text with ``ensure_ascii=False``, so the -32601 reply
    echoing the id holds a lone surrogate, which no text frame can carry (it cannot be
    encoded as UTF-8): the connection's writer must send that frame some other way or
    refuse it, and never drop the TCP connection without a close frame.
    """
    client = await ready_client(url)
    await client.send('{"jsonrpc":"2.0","id":"\\ud800","method":"no/such_method"}')
    reply = await client.call("session/list", {}, timeout=QUICK)
    assert "result" in reply, reply
    # an error for the bad frame (echoing the id escaped, or refusing the frame)
    assert [("error" in m) for m in client.inbox] == [True], client.inbox
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_lone_surrogate_in_params_is_refused_cleanly(url: str) -> None:
    """A cursor holding a lone surrogate is refused as invalid, not an internal error (-32603).

    ``CursorCodec.decode`` lets the UnicodeEncodeError of ``payload.encode()``
    escape; ``session_list`` catches only InvalidCursor, so the client gets -32603.
    """
    client = await ready_client(url)
    await client.send(
        '{"jsonrpc":"2.0","id":8,"method":"session/list","params":{"cursor":"\\ud800.AAAA"}}'
    )
    reply = await client.recv(QUICK)
    # refused as a bad cursor, or (if the broker refuses such frames outright) as bad JSON
    if reply["id"] == 8:
        assert_error(reply, -32602, 8)
    else:
        assert reply["id"] is None and reply["error"]["code"] in (-32700, -32600), reply
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_malformed_error_answer_to_a_permission_request_keeps_the_connection(
    url: str,
) -> None:
    """A client's error reply whose ``code`` is not a number fails that request only.

    ``PendingRequests.resolve`` does ``int(err.get("code", ...))``, which raises
    ValueError for ``"boom"`` out of ``_on_frame`` and the read loop: the
    connection dies.
    """
    client = await ready_client(url)
    created = await client.call("session/new", {"cwd": "/tmp/hostile", "mcpServers": []})
    session_id = created["result"]["sessionId"]
    client.next_id += 1
    prompt_id = client.next_id
    await client.send_prompt(prompt_id, session_id, "read a file")
    while True:  # wait for the agent's permission request, routed to this connection
        message = await client.recv(QUICK)
        if message.get("method") == "session/request_permission":
            break
        assert message.get("id") != prompt_id, message
    await client.send(
        {"jsonrpc": "2.0", "id": message["id"], "error": {"code": "boom", "message": "nope"}}
    )
    prompt_reply = await client.reply_to(prompt_id, QUICK)
    assert "result" in prompt_reply or "error" in prompt_reply
    reply = await client.call("session/list", {}, timeout=QUICK)
    assert session_id in [s["sessionId"] for s in reply["result"]["sessions"]], reply
    await client.close()
    await assert_broker_healthy(url)


@bounded
async def test_flood_of_bad_frames_then_normal_service(url: str) -> None:
    client = await ready_client(url)
    bad = [
        "{",
        "[]",
        "1",
        '{"jsonrpc":"2.0","id":1.5,"method":"m"}',
        '{"jsonrpc":"2.0","id":2,"method":"nope"}',
    ]
    for _ in range(40):
        for payload in bad:
            await client.send(payload)
    replies = [await client.recv(QUICK) for _ in range(40 * len(bad))]
    assert all("error" in r for r in replies)
    await still_answers(client)
    await client.close()
    await assert_broker_healthy(url)
