"""broker.protocol.jsonrpc: parsing frames, batches and numbers, and the error replies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import jsonrpc
from broker.protocol.jsonrpc import Invalid, Request, Response, parse_frame

from .support.strategies import _json, json_scalars

ERROR_CODES = {-32700, -32600, -32601, -32602, -32603, -32000, -32002, -32800}


def _strict_loads(text: str) -> Any:
    """JSON as RFC 8259 has it: no NaN or Infinity."""

    def reject(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=reject)


def assert_error_reply(reply: Any, code: int | None = None, msg_id: Any = None) -> None:
    """A well-formed JSON-RPC error response that can go out as one UTF-8 text frame."""
    assert isinstance(reply, dict)
    assert set(reply) == {"jsonrpc", "id", "error"}
    assert reply["jsonrpc"] == "2.0"
    assert (
        reply["id"] is None
        or isinstance(reply["id"], str)
        or (isinstance(reply["id"], int) and not isinstance(reply["id"], bool))
    )
    error = reply["error"]
    assert isinstance(error, dict) and set(error) <= {"code", "message", "data"}
    assert isinstance(error["code"], int) and error["code"] in ERROR_CODES
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code
    assert reply["id"] == msg_id
    wire = jsonrpc.encode(reply)
    wire.encode("utf-8")  # a text frame must be valid UTF-8
    assert _strict_loads(wire) == reply


def frame(**fields: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", **fields})


# -- parse_frame ------------------------------------------------------------------------------


def test_request_is_parsed() -> None:
    message = parse_frame(frame(id=7, method="session/list", params={"cwd": "/a"}))
    assert message == Request("session/list", {"cwd": "/a"}, 7)
    assert not message.is_notification


def test_request_with_string_id_and_no_params() -> None:
    assert parse_frame(frame(id="abc", method="m")) == Request("m", {}, "abc")
    assert parse_frame(frame(id=0, method="m", params=None)) == Request("m", {}, 0)


def test_notification_is_parsed() -> None:
    message = parse_frame(frame(method="session/cancel", params={"sessionId": "s"}))
    assert message == Request("session/cancel", {"sessionId": "s"}, None)
    assert isinstance(message, Request) and message.is_notification


def test_bytes_frame_is_parsed() -> None:
    assert parse_frame(frame(id=1, method="m").encode()) == Request("m", {}, 1)


def test_response_with_result_and_with_error() -> None:
    assert parse_frame(frame(id=3, result={"ok": True})) == Response(3, {"ok": True}, None)
    err = {"code": -32602, "message": "bad"}
    assert parse_frame(frame(id="x", error=err)) == Response("x", None, err)


@pytest.mark.parametrize("text", ["{", "not json", "", "   ", '{"jsonrpc": "2.0",}', "\x00"])
def test_invalid_json_is_a_parse_error_with_null_id(text: str) -> None:
    result = parse_frame(text)
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.PARSE_ERROR, None)


def test_invalid_utf8_bytes_is_a_parse_error() -> None:
    result = parse_frame(b'{"jsonrpc":"2.0","id":1,"method":"\xff"}')
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.PARSE_ERROR, None)


@pytest.mark.parametrize("text", ["1", "-3.5", '"a string"', "[]", "[1, 2]", "true", "null"])
def test_non_object_is_an_invalid_request(text: str) -> None:
    result = parse_frame(text)
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.INVALID_REQUEST, None)


def test_batch_array_of_requests_is_an_invalid_request() -> None:
    result = parse_frame(json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "m"}]))
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.INVALID_REQUEST, None)


def _notes(sizes: list[int]) -> list[str]:
    """Encoded notifications whose texts are about ``sizes`` characters long."""
    return [
        jsonrpc.encode(jsonrpc.notification("session/update", {"i": i, "pad": "x" * size}))
        for i, size in enumerate(sizes)
    ]


def _unpacked(frames: list[str]) -> list[Any]:
    out: list[Any] = []
    for text in frames:
        value = json.loads(text)
        out.extend(value if isinstance(value, list) else [value])
    return out


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), max_size=60),
    limit=st.integers(min_value=1, max_value=2000),
)
def test_packed_batches_hold_every_message_once_in_order_within_the_bound(
    sizes: list[int], limit: int
) -> None:
    texts = _notes(sizes)
    frames = list(jsonrpc.pack_batches(texts, limit))
    assert _unpacked(frames) == [json.loads(t) for t in texts]
    for text in frames:
        value = json.loads(text)
        if isinstance(value, list):  # a batch: never empty, never of one, within the bound
            assert len(value) >= 2 and len(text) <= limit
            assert all("id" not in m and m["method"] == "session/update" for m in value)
        else:  # bare: alone because the next would not fit, or it is longer than the bound
            assert text in texts


def test_packed_batches_are_bare_for_one_message_and_nothing_for_none() -> None:
    assert list(jsonrpc.pack_batches([], 100)) == []
    (one,) = _notes([10])
    assert list(jsonrpc.pack_batches([one], 100)) == [one]
    assert list(jsonrpc.pack_batches([one, one], 10)) == [one, one]  # each longer than the bound
    assert list(jsonrpc.pack_batches([one, one], 2 * len(one) + 3)) == [f"[{one},{one}]"]
    assert list(jsonrpc.pack_batches([one, one], 2 * len(one) + 2)) == [one, one]


@pytest.mark.parametrize("version", [None, "1.0", "2", 2.0, 2, ["2.0"]])
def test_wrong_or_missing_jsonrpc_version(version: Any) -> None:
    message: dict[str, Any] = {"id": 5, "method": "m"}
    if version is not None:
        message["jsonrpc"] = version
    result = parse_frame(json.dumps(message))
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.INVALID_REQUEST, 5)


@pytest.mark.parametrize("bad_id", [1.5, 1.0, True, False, {"a": 1}, [1]])
def test_request_id_of_wrong_type_is_an_invalid_request(bad_id: Any) -> None:
    result = parse_frame(frame(id=bad_id, method="m"))
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.INVALID_REQUEST, None)


@pytest.mark.parametrize("method", [None, "", 5, ["m"]])
def test_method_not_a_nonempty_string_is_an_invalid_request(method: Any) -> None:
    result = parse_frame(frame(id=9, method=method))
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.INVALID_REQUEST, 9)


def test_message_with_neither_method_nor_result_is_an_invalid_request() -> None:
    result = parse_frame(frame(id=4))
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.INVALID_REQUEST, 4)


@pytest.mark.parametrize("params", [[1, 2], "x", 3, True])
def test_params_not_an_object_is_invalid_params_with_the_id(params: Any) -> None:
    result = parse_frame(frame(id=11, method="m", params=params))
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.INVALID_PARAMS, 11)


@pytest.mark.parametrize("params", [[1, 2], "x", 3])
def test_params_not_an_object_in_a_notification_gets_no_reply(params: Any) -> None:
    assert parse_frame(frame(method="m", params=params)) == Invalid(None)


def test_nesting_beyond_max_depth_is_an_invalid_request() -> None:
    deep: dict[str, Any] = {"a": 1}
    for _ in range(10):
        deep = {"a": deep}
    text = frame(id=1, method="m", params=deep)
    assert isinstance(parse_frame(text, max_depth=64), Request)
    result = parse_frame(text, max_depth=5)
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.INVALID_REQUEST, None)


def test_max_depth_boundary() -> None:
    # depth counts containers: {"params": {}} is two deep
    assert isinstance(parse_frame(frame(id=1, method="m", params={}), max_depth=2), Request)
    result = parse_frame(frame(id=1, method="m", params={"x": []}), max_depth=2)
    assert isinstance(result, Invalid) and result.reply is not None


def test_nesting_deeper_than_the_interpreter_can_parse_is_an_error_not_a_crash() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000):
        result = parse_frame(text)
        assert isinstance(result, Invalid)
        assert result.reply is not None and result.reply["error"]["code"] in (-32700, -32600)
        assert_error_reply(result.reply, msg_id=None)


@pytest.mark.parametrize("id_text", ["1e999", "-1e999", "1E+400", "123456789012345678901234"])
def test_an_id_no_peer_could_echo_is_an_invalid_request_not_invalid_params(id_text: str) -> None:
    request = f'{{"jsonrpc":"2.0","id":{id_text},"method":"session/list","params":{{}}}}'
    parsed = parse_frame(request, strict_numbers=True)
    assert isinstance(parsed, Invalid) and parsed.reply is not None
    assert parsed.reply["id"] is None and parsed.reply["error"]["code"] == -32600
    # A reply with such an id is dropped, as any reply that cannot be matched.
    assert parse_frame(
        f'{{"jsonrpc":"2.0","id":{id_text},"result":{{}}}}', strict_numbers=True
    ) == (Invalid(None))


@pytest.mark.parametrize("bad_id", [None, "missing"])
def test_response_without_an_id_is_dropped_silently(bad_id: Any) -> None:
    message: dict[str, Any] = {"jsonrpc": "2.0", "result": 1}
    if bad_id is None:
        message["id"] = None
    assert parse_frame(json.dumps(message)) == Invalid(None)
    message.pop("result")
    message["error"] = {"code": -32603, "message": "x"}
    assert parse_frame(json.dumps(message)) == Invalid(None)


@pytest.mark.parametrize("bad_id", [1.5, True, {"a": 1}, [1]])
def test_response_with_an_unknown_id_shape_is_dropped_silently(bad_id: Any) -> None:
    """A response is never answered (answering one invites an error ping-pong between peers).

    ``parse_message`` checks the id shape before it knows the message is a
    response, so a response with a float/bool/object id earns a -32600 reply;
    its own "a reply we cannot correlate" branch is unreachable for them.
    """
    assert parse_frame(frame(id=bad_id, result={"x": 1})) == Invalid(None)
    assert parse_frame(frame(id=bad_id, error={"code": 1, "message": "m"})) == Invalid(None)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_number_literals_are_rejected(literal: str) -> None:
    """NaN and Infinity are not JSON (RFC 8259 section 6).

    Python's json accepts them; the broker would store them (e.g. in ``_meta``)
    and later send them to every client as ``NaN``, which strict parsers reject.
    """
    text = '{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"x":' + literal + "}}}"
    result = parse_frame(text)
    assert isinstance(result, Invalid)
    assert_error_reply(result.reply, jsonrpc.PARSE_ERROR, None)


def test_error_reply_to_a_lone_surrogate_id_can_be_sent() -> None:
    """``"\\ud800"`` is valid JSON text; the reply echoing it must still be valid UTF-8.

    ``encode`` uses ``ensure_ascii=False``, so the echoed id becomes a lone
    surrogate that no UTF-8 text frame can carry.
    """
    text = '{"jsonrpc":"2.0","id":"\\ud800","method":"m","params":[1]}'
    result = parse_frame(text)
    assert isinstance(result, Invalid) and result.reply is not None
    jsonrpc.encode(result.reply).encode("utf-8")


def test_error_reply_shapes() -> None:
    err = jsonrpc.RpcError(jsonrpc.INVALID_PARAMS, "bad", {"field": "cwd"})
    assert jsonrpc.error_reply(3, err) == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {"code": -32602, "message": "bad", "data": {"field": "cwd"}},
    }
    assert "data" not in jsonrpc.error_reply(None, jsonrpc.not_found("session"))["error"]
    assert jsonrpc.not_found("session").code == jsonrpc.RESOURCE_NOT_FOUND


# Also valid JSON strings holding lone surrogates ("\ud800"), which st.text never makes.
hostile_json_values = _json(
    json_scalars | st.lists(st.sampled_from(["a", "\ud800", "\udfff"]), max_size=3).map("".join)
)
message_like = st.dictionaries(
    st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error"]),
    st.sampled_from(["2.0", "m", 1, None, "\ud800"]) | hostile_json_values,
    max_size=6,
)


def _check_parse_outcome(result: Any) -> None:
    assert isinstance(result, Request | Response | Invalid)
    if isinstance(result, Invalid) and result.reply is not None:
        assert_error_reply(result.reply, msg_id=result.reply["id"])
    if isinstance(result, Request):
        assert isinstance(result.method, str) and result.method
        assert isinstance(result.params, dict)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parse_frame_never_raises_on_arbitrary_text(text: str) -> None:
    _check_parse_outcome(parse_frame(text))


@settings(max_examples=300, deadline=None)
@given(hostile_json_values | message_like)
def test_parse_frame_never_raises_on_arbitrary_json(value: Any) -> None:
    _check_parse_outcome(parse_frame(json.dumps(value)))
    _check_parse_outcome(parse_frame(json.dumps(value), max_depth=4))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=100))
def test_parse_frame_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    _check_parse_outcome(parse_frame(data))


@settings(max_examples=500, deadline=None)
@given(
    message_like
    | st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": st.text(max_size=3)},
        optional={
            "id": st.none() | st.booleans() | st.integers() | st.text(max_size=2) | st.floats(),
            "params": st.none()
            | st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)
            | st.lists(st.integers(), max_size=2),
        },
    )
)
def test_well_formed_requests_read_fast_are_what_the_full_rules_make_of_them(value: Any) -> None:
    assert jsonrpc.parse_message(value) == jsonrpc._classify(value)
