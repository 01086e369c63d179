"""Pure unit tests of the v2 surface: negotiation, replayFrom, translation, rendering, batches.

Every v2 shape produced here is checked against the official v2 schema, every v1 shape
handed to agents against the v1 schema.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.protocol import capabilities, jsonrpc, v2, v2_render, v2_translate
from broker.protocol.jsonrpc import Batch, Invalid, Request, RpcError
from broker.store.events import EventType, LogEvent

from .support.schemas import _validator

EPOCH = "e0e0e0e0"


def valid(version: int, name: str, value: Any) -> None:
    errors = list(_validator(version, name).iter_errors(value))
    assert not errors, f"{name}: {errors[0]}"


def event(seq: int, body: dict[str, Any]) -> LogEvent:
    return LogEvent(seq=seq, epoch=EPOCH, ts=0, body=body)


def update_event(seq: int, update: dict[str, Any]) -> LogEvent:
    return event(seq, {"type": EventType.UPDATE, "update": update})


def chunk(text: str, kind: str = "agent_message_chunk") -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


# -- negotiation and initialize ---------------------------------------------------------------


@pytest.mark.parametrize(("asked", "got"), [(1, 1), (2, 2), (0, 2), (3, 2), (1000, 2)])
def test_negotiate_answers_the_asked_version_or_our_latest(asked: int, got: int) -> None:
    assert v2.negotiate(asked) == got


def test_initialize_result_has_v2_shapes() -> None:
    agents = capabilities.combined(
        ["a"],
        {
            "a": {
                "promptCapabilities": {"image": True, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": True, "sse": True},
                "sessionCapabilities": {"fork": {}},
            }
        },
    )
    result = v2.initialize_result(agents)
    valid(2, "InitializeResponse", result)
    session = result["capabilities"]["session"]
    assert session["prompt"] == {"image": {}, "embeddedContext": {}}
    assert session["mcp"] == {"stdio": {}, "http": {}}  # v2 has no SSE transport
    assert session["title"] == {} and session["fork"] == {}  # unstable capabilities
    assert session["delete"] == {} and session["additionalDirectories"] == {}
    assert result["info"]["name"] == "acp-broker" and result["authMethods"] == []


# -- replayFrom -------------------------------------------------------------------------------


def test_replay_from_start_position_and_none() -> None:
    assert v2.replay_after(None, epoch=EPOCH, head=9) is None
    assert v2.replay_after({"type": "start"}, epoch=EPOCH, head=9) == 0
    at = {"type": v2.REPLAY_POSITION, "seq": 4, "epoch": EPOCH}
    assert v2.replay_after(at, epoch=EPOCH, head=9) == 3  # inclusive: replay 4 onwards
    caught_up = {"type": v2.REPLAY_POSITION, "seq": 10, "epoch": EPOCH}
    assert v2.replay_after(caught_up, epoch=EPOCH, head=9) == 9


@pytest.mark.parametrize(
    "value",
    [
        {"type": v2.REPLAY_POSITION, "seq": 4, "epoch": "other"},
        {"type": v2.REPLAY_POSITION, "seq": 11, "epoch": EPOCH},
        {"type": v2.REPLAY_POSITION, "seq": 0, "epoch": EPOCH},
        {"type": v2.REPLAY_POSITION, "seq": True, "epoch": EPOCH},
        {"type": v2.REPLAY_POSITION, "seq": 3},
        {"type": "message"},
        {"kind": "start"},
        "start",
        [],
    ],
)
def test_bad_replay_from_is_invalid_params(value: Any) -> None:
    with pytest.raises(RpcError) as err:
        v2.replay_after(value, epoch=EPOCH, head=9)
    assert err.value.code == jsonrpc.INVALID_PARAMS


# -- v1 updates as v2 -------------------------------------------------------------------------


def translate(update: dict[str, Any]) -> dict[str, Any] | None:
    return v2_translate.update(update, lambda role, own: f"m-{role}-{own}", "plan-1")


def test_chunks_get_message_ids_and_keep_the_agents_own() -> None:
    for kind, role in v2_translate.MESSAGE_CHUNKS.items():
        out = translate(chunk("hi", kind))
        assert out is not None and out["messageId"] == f"m-{role}-None"
        valid(2, "SessionUpdate", out)
    own = translate({**chunk("hi"), "messageId": "a1"})
    assert own is not None and own["messageId"] == "m-agent-a1"


def test_tool_call_becomes_an_upsert_with_a_structured_diff() -> None:
    v1 = {
        "sessionUpdate": "tool_call",
        "toolCallId": "c1",
        "title": "Edit",
        "kind": "edit",
        "status": "pending",
        "content": [
            {"type": "diff", "path": "/p/a.txt", "oldText": "one\ntwo\n", "newText": "one\n2\n"},
            {"type": "diff", "path": "/p/new.txt", "newText": "x"},
            {"type": "content", "content": {"type": "text", "text": "note"}},
        ],
    }
    out = translate(v1)
    assert out is not None and out["sessionUpdate"] == "tool_call_update"
    valid(2, "SessionUpdate", out)
    modify, add, note = out["content"]
    assert modify["changes"] == [{"operation": "modify", "path": "/p/a.txt", "fileType": "text"}]
    assert modify["patch"]["text"] == (
        "diff --git /p/a.txt /p/a.txt\n--- /p/a.txt\n+++ /p/a.txt\n"
        "@@ -1,2 +1,2 @@\n one\n-two\n+2\n"
    )
    assert add["changes"][0]["operation"] == "add"
    assert add["patch"]["text"] == (
        "diff --git /p/new.txt /p/new.txt\nnew file mode 100644\n--- /dev/null\n+++ /p/new.txt\n"
        "@@ -0,0 +1 @@\n+x\n\\ No newline at end of file\n"
    )
    assert note == v1["content"][2]


def test_plan_commands_and_config_options_get_their_v2_shapes() -> None:
    entries = [{"content": "a", "priority": "high", "status": "pending"}]
    plan = translate({"sessionUpdate": "plan", "entries": entries})
    assert plan == {
        "sessionUpdate": "plan_update",
        "plan": {"type": "items", "planId": "plan-1", "entries": entries},
    }
    commands = translate(
        {
            "sessionUpdate": "available_commands_update",
            "availableCommands": [
                {"name": "s", "description": "search", "input": {"hint": "query"}},
                {"name": "t", "description": "plain"},
            ],
        }
    )
    assert commands is not None
    assert commands["availableCommands"][0]["input"] == {"type": "text", "hint": "query"}
    option = {
        "id": "model",
        "name": "Model",
        "type": "select",
        "currentValue": "a",
        "options": [{"group": "g", "name": "G", "options": [{"value": "a", "name": "A"}]}],
    }
    config = translate({"sessionUpdate": "config_option_update", "configOptions": [option]})
    assert config is not None
    [renamed] = config["configOptions"]
    assert renamed["configId"] == "model" and "id" not in renamed
    assert renamed["options"][0]["groupId"] == "g"
    for out in (plan, commands, config):
        valid(2, "SessionUpdate", out)


def test_v1_only_and_unknown_updates_are_dropped_extensions_kept() -> None:
    assert translate({"sessionUpdate": "current_mode_update", "currentModeId": "x"}) is None
    assert translate({"sessionUpdate": "future_thing"}) is None
    assert translate({"sessionUpdate": "_vendor_thing", "x": 1}) == {
        "sessionUpdate": "_vendor_thing",
        "x": 1,
    }
    info = {"sessionUpdate": "session_info_update", "title": None, "_meta": {"k": None}}
    assert translate(info) == info  # identical for v1 and v2 viewers


def test_permission_request_gets_a_title_and_a_tool_call_subject() -> None:
    v1 = {
        "sessionId": "s",
        "toolCall": {"toolCallId": "c1", "title": "Read it", "kind": "read", "status": "pending"},
        "options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}],
    }
    out = v2.client_request("session/request_permission", v1)
    valid(2, "RequestPermissionRequest", out)
    assert out["title"] == "Read it" and "toolCall" not in out
    assert out["subject"] == {"type": "tool_call", "toolCall": v1["toolCall"]}
    bare = v2.client_request("session/request_permission", {**v1, "toolCall": None})
    valid(2, "RequestPermissionRequest", bare)


def test_v2_clients_are_never_sent_v1_client_methods() -> None:
    for method in ("fs/read_text_file", "fs/write_text_file", "terminal/create"):
        assert not v2.client_answers(method)
    for method in ("session/request_permission", "elicitation/create", "_vendor/ask"):
        assert v2.client_answers(method)


def test_session_replies_drop_modes_and_rename_config_options() -> None:
    option = {"id": "s", "name": "S", "type": "boolean", "currentValue": True}
    reply = {"sessionId": "x", "modes": {"currentModeId": "a"}, "configOptions": [option]}
    out = v2.result("session/new", reply)
    valid(2, "NewSessionResponse", out)
    assert set(out) == {"sessionId", "configOptions"}
    assert out["configOptions"][0]["configId"] == "s"
    assert v2.result("session/resume", {"modes": {}}) == {}
    assert v2.result("session/list", {"sessions": []}) == {"sessions": []}


def test_mcp_servers_go_to_agents_in_v1_shape() -> None:
    params = v2.agent_params(
        {
            "cwd": "/p",
            "mcpServers": [
                {"type": "stdio", "name": "fs", "command": "/bin/fs"},
                {"type": "http", "name": "web", "url": "https://x.example/mcp"},
            ],
        }
    )
    stdio, http = params["mcpServers"]
    assert stdio == {"name": "fs", "command": "/bin/fs", "args": [], "env": []}
    assert http["headers"] == []
    for server in params["mcpServers"]:
        valid(1, "McpServer", server)
    assert v2.agent_params({"cwd": "/p"})["mcpServers"] == []


# -- log events as v2 updates -----------------------------------------------------------------


LOG = [
    event(1, {"type": EventType.CREATED, "cwd": "/p"}),
    event(
        2, {"type": EventType.PROMPT, "promptId": "p1", "prompt": [{"type": "text", "text": "q"}]}
    ),
    update_event(3, chunk("a")),
    event(4, {"type": EventType.STATE, "state": "requires_action"}),
    event(5, {"type": EventType.STATE, "state": "running"}),
    update_event(6, chunk("b")),
    update_event(7, chunk("t", "agent_thought_chunk")),
    event(8, {"type": EventType.PROMPT_END, "promptId": "p1", "stopReason": "end_turn"}),
    event(9, {"type": EventType.NOTICE, "text": "restarted"}),
    event(10, {"type": EventType.PROMPT, "promptId": "p2", "prompt": []}),
    event(
        11,
        {"type": EventType.PROMPT_END, "promptId": "p2", "error": {"code": -32603, "message": "x"}},
    ),
]


def render(events: list[LogEvent], turn: int | None = None) -> list[dict[str, Any]]:
    out = []
    for each in events:
        out.extend(v2_render.session_updates(each, "sess_1", turn))
        turn = v2_render.next_turn(each, turn)
    return out


def test_a_log_renders_the_v2_prompt_lifecycle() -> None:
    messages = render(LOG)
    for message in messages:
        valid(2, "UpdateSessionNotification", message["params"])
    updates = [m["params"]["update"] for m in messages]
    assert [u["sessionUpdate"] for u in updates] == [
        "user_message",
        "state_update",
        "agent_message_chunk",
        "state_update",
        "state_update",
        "agent_message_chunk",
        "agent_thought_chunk",
        "state_update",
        "notice",
        "user_message",
        "state_update",
        "state_update",
    ]
    states = [(u.get("state"), u.get("stopReason")) for u in updates if "state" in u]
    assert states == [
        ("running", None),
        ("requires_action", None),
        ("running", None),
        ("idle", "end_turn"),
        ("running", None),
        ("idle", v2_render.ERROR_STOP_REASON),
    ]
    ids = [u.get("messageId") for u in updates]
    assert ids[2] == ids[5] != ids[6]  # one agent message, one thought for the turn
    assert ids[0] == f"msg_{EPOCH}_2_user" and ids[9] == f"msg_{EPOCH}_10_user"
    assert len({ids[0], ids[2], ids[6], ids[9]}) == 4 and ids[8] is None  # notices: no id
    assert all(m["params"]["_meta"]["acpBroker/position"]["epoch"] == EPOCH for m in messages)


def test_a_replay_from_any_point_renders_what_the_live_stream_did() -> None:
    live = render(LOG)
    for start in range(len(LOG) + 1):
        found, turn = v2_render.open_turn(LOG[:start])
        assert found or turn is None
        suffix = [m for m in live if m["params"]["_meta"]["acpBroker/position"]["seq"] > start]
        assert render(LOG[start:], turn) == suffix


# -- batches ----------------------------------------------------------------------------------


def test_batch_parsing_follows_json_rpc() -> None:
    empty = jsonrpc.parse_frame_or_batch("[]")
    assert isinstance(empty, Invalid) and empty.reply is not None
    assert empty.reply["id"] is None and empty.reply["error"]["code"] == jsonrpc.INVALID_REQUEST
    batch = jsonrpc.parse_frame_or_batch(
        '[1, {"jsonrpc":"2.0","id":7}, {"jsonrpc":"2.0","id":8,"method":"m"},'
        ' {"jsonrpc":"2.0","method":"n","params":[1]}]'
    )
    assert isinstance(batch, Batch)
    first, second, request, bad_params = batch.entries
    for entry in (first, second):
        assert isinstance(entry, Invalid) and entry.reply is not None
        assert entry.reply["id"] is None and entry.reply["error"]["code"] == -32600
    assert request == Request("m", {}, 8)
    assert isinstance(bad_params, Invalid) and bad_params.reply is None  # a notification
    # Without batch support (v1) an array is one Invalid Request.
    single = jsonrpc.parse_frame('[{"jsonrpc":"2.0","id":8,"method":"m"}]')
    assert isinstance(single, Invalid) and single.reply is not None
    assert single.reply["error"]["code"] == -32600
