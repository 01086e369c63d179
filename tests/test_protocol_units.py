"""Pure unit tests: JSON-RPC framing, cursors, the key scheme, the fold, index helpers.

No sockets and no broker; the one store used (the fold property) is the embedded one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from datetime import datetime
from typing import Any

import pytest
import redis.crc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.front.acp.flow import Pace
from broker.protocol import jsonrpc, v2_render, v2_translate
from broker.protocol.jsonrpc import Invalid, Request, Response, parse_frame
from broker.protocol.render import StoredUpdates, session_update_frames
from broker.store import keys
from broker.store.client import connect
from broker.store.cursors import CursorCodec, InvalidCursor, fingerprint
from broker.store.events import EventType, LogEvent, SessionSnapshot, Status, dumps, event_of, fold
from broker.store.index import member, normalize_cwd, page_of, rfc3339
from broker.store.log import SessionLog

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


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


def _json(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=25,
    )


json_values = _json(json_scalars)

# -- v1 frames straight from stored text (a replay) ------------------------------------------

_update_kinds = st.sampled_from(["agent_message_chunk", "tool_call", "notice", "plan"])
_updates = st.builds(
    lambda kind, rest: {"sessionUpdate": kind, **rest},
    _update_kinds,
    st.dictionaries(st.sampled_from(["content", "title", "_meta", "x"]), json_values, max_size=3),
) | st.dictionaries(st.sampled_from(["content", "sessionUpdate"]), json_values, max_size=2)
_stored_bodies = (
    st.builds(lambda u: {"type": "update", "update": u}, _updates)
    | st.builds(lambda u, o: {"type": "update", "update": u, "origin": o}, _updates, json_values)
    | st.builds(lambda o, u: {"type": "update", "origin": o, "update": u}, json_values, _updates)
    | st.builds(lambda p: {"type": "prompt", "prompt": p, "promptId": "p1"}, st.lists(json_values))
    | st.builds(lambda t: {"type": "notice", "title": t, "text": "why"}, st.text(max_size=8))
    | st.sampled_from([{"type": "deleted"}, {"type": "status", "status": "STOPPED"}])
)


@settings(max_examples=300, deadline=None)
@given(body=_stored_bodies, seq=st.integers(min_value=1, max_value=10**7))
def test_frames_from_stored_text_are_those_of_the_parsed_event(body: Any, seq: int) -> None:
    """A replay's frame made from an event's stored text, where it is made (a plain update
    other than a notice), is the very text rendering the parsed event makes for every v1 viewer;
    every other event is left to that rendering."""
    text = dumps(body)
    event = event_of((seq, 0, text), "e0e0")
    frame = StoredUpdates("sess_1", "e0e0").frame(text, seq)
    update = body.get("update")
    plain = list(body) == ["type", "update"] and isinstance(update, dict)
    if plain and update.get("sessionUpdate") != "notice":
        assert frame is not None
    if frame is not None:
        assert plain
        for notices in (False, True):
            assert session_update_frames(event, "sess_1", notices) == [frame]


_chunk_updates = st.builds(
    lambda kind, rest: {"sessionUpdate": kind, **rest},
    st.sampled_from(["agent_message_chunk", "agent_thought_chunk", "user_message_chunk"]),
    st.dictionaries(st.sampled_from(["content", "messageId", "_meta"]), json_values, max_size=3),
)
_stored_chunk_bodies = _stored_bodies | st.builds(
    lambda u: {"type": "update", "update": u}, _chunk_updates
)


@settings(max_examples=300, deadline=None)
@given(
    body=_stored_chunk_bodies,
    seq=st.integers(min_value=1, max_value=10**7),
    turn=st.none() | st.integers(min_value=1, max_value=10**7),
)
def test_v2_chunk_frames_from_stored_text_are_those_of_the_parsed_event(
    body: Any, seq: int, turn: int | None
) -> None:
    """A v2 replay's frame made from a message chunk's stored text, where it is made (a plain
    chunk without an id of its own), is the very text the parsed event renders to for a v2
    viewer in that turn; every other event is left to that rendering."""
    text = dumps(body)
    event = event_of((seq, 0, text), "e0e0")
    frame = v2_render.StoredChunks("sess_1", "e0e0").frame(text, seq, turn)
    update = body.get("update")
    plain = list(body) == ["type", "update"] and isinstance(update, dict)
    kind = update.get("sessionUpdate") if plain else None
    chunk = isinstance(kind, str) and kind in v2_translate.MESSAGE_CHUNKS
    if chunk and "messageId" not in update:
        assert frame is not None
    if frame is not None:
        assert chunk
        rendered = v2_render.session_updates(event, "sess_1", turn)
        assert [jsonrpc.encode(m) for m in rendered] == [frame]


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


# -- session/update frames ---------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)
_update_bodies = st.one_of(
    st.builds(
        lambda kind, rest: {"type": EventType.UPDATE, "update": {"sessionUpdate": kind, **rest}},
        st.sampled_from(["agent_message_chunk", "notice", "tool_call"]),
        st.dictionaries(st.text(), _json_values, max_size=3),
    ),
    st.builds(
        lambda blocks: {"type": EventType.PROMPT, "prompt": blocks},
        st.lists(st.dictionaries(st.text(), _json_values, max_size=2), max_size=3),
    ),
    st.builds(lambda text: {"type": EventType.NOTICE, "text": text}, st.text()),
    st.just({"type": EventType.CREATED, "cwd": "/w"}),
)


@settings(max_examples=300, deadline=None)
@given(
    _update_bodies,
    st.integers(min_value=1, max_value=2**53),
    st.text(st.characters(codec="utf-8"), max_size=8),
    st.booleans(),
)
def test_session_update_frames_are_the_encoded_notifications(
    body: dict[str, Any], seq: int, epoch: str, notices: bool
) -> None:
    from broker.protocol.render import session_update_frames, session_updates

    event = LogEvent(seq, epoch, 1, body)
    frames = session_update_frames(event, "sess_0001", notices)
    messages = session_updates(event, "sess_0001", notices)
    assert [json.loads(f) for f in frames] == [json.loads(jsonrpc.encode(m)) for m in messages]
    assert frames == [jsonrpc.encode(m) for m in messages] or any(
        isinstance(v, float) for v in _leaves(body)
    )


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


# -- cursors ----------------------------------------------------------------------------------

KEY, OLD_KEY = b"k" * 32, b"old" * 11
FP = fingerprint("tenant-a", "acp", {})


def test_cursor_round_trip() -> None:
    codec = CursorCodec([KEY])
    for position in ["0000000000001:sess_a", "", "pos:with:colons", "ünïcödé"]:
        cursor = codec.encode(position, FP)
        assert isinstance(cursor, str) and cursor.isascii() and " " not in cursor
        assert codec.decode(cursor, FP) == position
        # any node with the same key reads it
        assert CursorCodec([KEY]).decode(cursor, FP) == position


def test_a_cursor_checked_once_is_still_checked_for_its_listing() -> None:
    """Cursors are remembered once made or verified: the memo answers only what the same
    check would (the same text for the same fingerprint), never a forgery or another
    listing's."""
    codec = CursorCodec([KEY])
    cursor = codec.encode("0000000000001:sess_a", FP)
    assert codec.encode("0000000000001:sess_a", FP) == cursor
    for _ in range(2):
        assert codec.decode(cursor, FP) == "0000000000001:sess_a"
        with pytest.raises(InvalidCursor):
            codec.decode(cursor, fingerprint("tenant-b", "acp", {}))
        with pytest.raises(InvalidCursor):
            codec.decode(_flip(cursor, 3), FP)
    for i in range(5000):  # past the memo's bound: forgotten, and checked afresh
        codec.decode(codec.encode(f"{i:013d}:sess_b", FP), FP)
    assert codec.decode(cursor, FP) == "0000000000001:sess_a"


def test_codec_needs_a_key() -> None:
    with pytest.raises(ValueError):
        CursorCodec([])


def _flip(text: str, index: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    char = text[index]
    replacement = alphabet[(alphabet.index(char) + 1) % len(alphabet)]
    return text[:index] + replacement + text[index + 1 :]


def test_tampered_payload_is_rejected() -> None:
    codec = CursorCodec([KEY])
    cursor = codec.encode("0000000000001:sess_a", FP)
    payload, tag = cursor.split(".")
    for index in range(len(payload) - 1):  # the last char may hold only padding bits
        with pytest.raises(InvalidCursor):
            codec.decode(_flip(payload, index) + "." + tag, FP)


def test_forged_payload_with_another_position_is_rejected() -> None:
    codec = CursorCodec([KEY])
    cursor = codec.encode("0000000000001:sess_a", FP)
    _, tag = cursor.split(".")
    forged = base64.urlsafe_b64encode(
        json.dumps({"p": "0000000000000:sess_z", "f": FP}, separators=(",", ":")).encode()
    )
    with pytest.raises(InvalidCursor):
        codec.decode(forged.decode().rstrip("=") + "." + tag, FP)


def test_tampered_tag_is_rejected() -> None:
    codec = CursorCodec([KEY])
    cursor = codec.encode("0000000000001:sess_a", FP)
    payload, tag = cursor.split(".")
    for index in range(len(tag) - 1):
        with pytest.raises(InvalidCursor):
            codec.decode(payload + "." + _flip(tag, index), FP)


def test_extra_characters_after_the_tag_are_rejected() -> None:
    """Only the exact cursor the broker handed out is valid.

    ``_unb64`` decodes with ``validate=False``, which skips characters outside
    the alphabet and accepts extra padding, so ``cursor + "!!!!"`` or
    ``cursor + "===="`` decodes to the same tag and is accepted.
    """
    codec = CursorCodec([KEY])
    cursor = codec.encode("0000000000001:sess_a", FP)
    for junk in ["!!!!", "====", "$$$$"]:
        with pytest.raises(InvalidCursor):
            codec.decode(cursor + junk, FP)


@pytest.mark.parametrize(
    "cursor",
    ["", ".", "abc", "abc.", ".abc", "a.b.c", "!!!.???", "not base64.at all", "é.é", "🙂.🙂"],
)
def test_garbage_cursors_are_rejected(cursor: str) -> None:
    with pytest.raises(InvalidCursor):
        CursorCodec([KEY]).decode(cursor, FP)


def test_truncated_cursors_are_rejected() -> None:
    codec = CursorCodec([KEY])
    cursor = codec.encode("0000000000001:sess_a", FP)
    for length in range(len(cursor)):
        with pytest.raises(InvalidCursor):
            codec.decode(cursor[:length], FP)


def test_cursor_with_a_lone_surrogate_is_rejected_cleanly() -> None:
    """A JSON string may carry ``\\ud800``; ``payload.encode()`` must not escape as an error.

    ``CursorCodec._tag`` encodes the payload with strict UTF-8, so the decode
    raises ``UnicodeEncodeError`` (a ValueError, not InvalidCursor): session/list
    answers -32603 instead of -32602.
    """
    codec = CursorCodec([KEY])
    for cursor in ["\ud800.abc", "eyJ\udfff.AAAA"]:
        with pytest.raises(InvalidCursor):
            codec.decode(cursor, FP)


def test_cursor_for_another_tenant_or_filter_is_rejected() -> None:
    codec = CursorCodec([KEY])
    cursor = codec.encode("0000000000001:sess_a", FP)
    others = [
        fingerprint("tenant-b", "acp", {}),
        fingerprint("tenant-a", "rest", {}),
        fingerprint("tenant-a", "acp", {"cwd": "/a"}),
        fingerprint("tenant-a", "acp", {"cwd": "/b"}),
    ]
    assert len({FP, *others}) == 5
    for other in others:
        with pytest.raises(InvalidCursor):
            codec.decode(cursor, other)
    # the filters' order does not matter, their values do
    assert fingerprint("t", "rest", {"a": 1, "b": 2}) == fingerprint("t", "rest", {"b": 2, "a": 1})
    assert fingerprint("t", "rest", {"a": 1}) != fingerprint("t", "rest", {"a": "1"})


def test_cursor_signed_with_another_key_is_rejected() -> None:
    cursor = CursorCodec([b"someone else"]).encode("0000000000001:sess_a", FP)
    with pytest.raises(InvalidCursor):
        CursorCodec([KEY]).decode(cursor, FP)


def test_key_rotation() -> None:
    old_cursor = CursorCodec([OLD_KEY]).encode("0000000000001:sess_a", FP)
    rotated = CursorCodec([KEY, OLD_KEY])
    assert rotated.decode(old_cursor, FP) == "0000000000001:sess_a"
    new_cursor = rotated.encode("0000000000002:sess_b", FP)
    assert CursorCodec([KEY]).decode(new_cursor, FP) == "0000000000002:sess_b"
    with pytest.raises(InvalidCursor):
        CursorCodec([OLD_KEY]).decode(new_cursor, FP)
    with pytest.raises(InvalidCursor):
        CursorCodec([KEY]).decode(old_cursor, FP)


B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_="
# Mostly the cursor alphabet, plus anything, plus lone surrogates (valid in JSON strings).
# (st.text drops surrogates even from an explicit alphabet, so join lists of characters)
any_text = st.lists(
    st.sampled_from([*B64_ALPHABET, ".", "\ud800", "\udfff"]) | st.characters(), max_size=80
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    any_text
    | st.builds(lambda a, b: f"{a}.{b}", any_text, any_text)
    | st.builds(lambda a, b: f"{a}.{b}", any_text, st.text(alphabet=B64_ALPHABET, max_size=24))
)
def test_decode_raises_only_invalid_cursor(cursor: str) -> None:
    codec = CursorCodec([KEY, OLD_KEY])
    with contextlib.suppress(InvalidCursor):
        codec.decode(cursor, FP)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60), st.text(max_size=20))
def test_round_trip_property(position: str, tenant: str) -> None:
    mark = fingerprint(tenant, "acp", {})
    codec = CursorCodec([KEY])
    assert codec.decode(codec.encode(position, mark), mark) == position


# -- keys -------------------------------------------------------------------------------------


def test_key_slot_known_values() -> None:
    assert keys.key_slot("foo") == 12182
    assert keys.key_slot("123456789") == 12739  # CRC16/XMODEM check value 0x31C3
    assert keys.key_slot("{user1000}.following") == keys.key_slot("{user1000}.followers")
    assert keys.key_slot("foo{bar}{zap}") == keys.key_slot("bar")
    assert keys.key_slot("foo{}{bar}") == redis.crc.key_slot(b"foo{}{bar}")
    assert keys.key_slot("foo{{bar}}zap") == keys.key_slot("{bar")
    assert keys.key_slot("foo{bar") == redis.crc.key_slot(b"foo{bar")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab{}:.x1é"), max_size=16) | st.text(max_size=16))
def test_key_slot_matches_redis_py(key: str) -> None:
    assert keys.key_slot(key) == redis.crc.key_slot(key.encode())


def test_partition_tags_fall_into_their_own_slot_ranges() -> None:
    width = keys.SLOTS // keys.PARTITIONS
    assert keys.PARTITIONS * width == keys.SLOTS
    seen = set()
    for partition in range(keys.PARTITIONS):
        tag = keys.partition_tag(partition)
        assert "{" not in tag and "}" not in tag
        slot = keys.key_slot(tag)
        assert partition * width <= slot < (partition + 1) * width, (partition, tag, slot)
        assert keys.key_slot(f"anything:{{{tag}}}:rest") == slot
        assert tag == f"p{partition}.{keys._find_tag_suffix(partition)}"
        seen.add(tag)
    assert len(seen) == keys.PARTITIONS
    assert len(keys._TAG_SUFFIXES) == keys.PARTITIONS


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_all_keys_of_a_session_share_one_slot(tenant: str, session_id: str) -> None:
    session = keys.SessionKeys(tenant, session_id)
    assert 0 <= session.partition < keys.PARTITIONS
    assert session.partition == keys.partition_of(session_id)
    names = [session.log, session.snapshot, session.meta, session.channel, session.feed]
    assert len(set(names)) == 5
    slots = {keys.key_slot(name) for name in names}
    assert slots == {keys.key_slot(keys.partition_tag(session.partition))}
    assert session.feed == keys.feed_key(session.partition)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=20))
def test_all_keys_of_a_tenant_share_one_slot(tenant: str, listing: str) -> None:
    tenant_keys = keys.TenantKeys(tenant)
    names = [tenant_keys.rows, tenant_keys.versions, tenant_keys.index(listing)]
    names.append(tenant_keys.index("acp"))
    assert len({keys.key_slot(name) for name in names}) == 1


def test_session_keys_differ_by_tenant() -> None:
    a, b = keys.SessionKeys("a", "sess_1"), keys.SessionKeys("b", "sess_1")
    assert a.partition == b.partition
    assert {a.log, a.snapshot, a.meta}.isdisjoint({b.log, b.snapshot, b.meta})


def test_partitions_spread_sessions() -> None:
    counts = [0] * keys.PARTITIONS
    for n in range(256 * 40):
        counts[keys.partition_of(f"sess_{n:08x}")] += 1
    assert min(counts) > 10 and max(counts) < 80


# -- events and fold --------------------------------------------------------------------------

EPOCH = "e0"


def ev(seq: int, body: dict[str, Any], ts: int | None = None) -> LogEvent:
    return LogEvent(seq=seq, epoch=EPOCH, ts=1000 + seq if ts is None else ts, body=body)


def info(**fields: Any) -> dict[str, Any]:
    update = {"sessionUpdate": "session_info_update"}
    update.update({("_meta" if k == "meta" else k): v for k, v in fields.items()})
    return {"type": EventType.UPDATE, "update": update}


CREATED = {
    "type": EventType.CREATED,
    "cwd": "/w/p",
    "additionalDirectories": ["/w/lib"],
    "agent": "demo",
    "kind": "shell",
    "meta": {"a": 1, "b": {"x": [1, 2]}},
}


def test_fold_of_nothing_is_none() -> None:
    assert fold("t", "s", []) is None


def test_fold_of_a_hand_made_log() -> None:
    bodies: list[dict[str, Any]] = [
        CREATED,
        info(title="First"),
        info(meta={"a": None, "c": "new"}),
        info(updatedAt="2024-05-01T00:00:00Z"),
        {"type": EventType.UPDATE, "update": {"sessionUpdate": "agent_message_chunk"}},
        {"type": EventType.PROMPT, "promptId": "p1"},
        {"type": EventType.BOUND, "agentSessionId": "agent-1"},
        info(title=None, meta={"b": None}),
        {"type": EventType.PROMPT_END, "stopReason": "end_turn"},
        {"type": EventType.STATUS, "status": Status.STOPPED},
        info(updatedAt=None, title="Second"),
        info(meta=None),
    ]
    events = [ev(n + 1, body) for n, body in enumerate(bodies)]

    def at(n: int) -> SessionSnapshot:
        snap = fold("t", "s", events[:n])
        assert snap is not None
        return snap

    first = at(1)
    assert (first.tenant, first.session_id, first.epoch, first.seq) == ("t", "s", EPOCH, 1)
    assert (first.created_ms, first.updated_ms) == (1001, 1001)
    assert first.cwd == "/w/p" and first.additional_directories == ["/w/lib"]
    assert (first.agent, first.kind, first.status) == ("demo", "shell", Status.RUNNING)
    assert first.title is None and first.updated_at is None and first.prompt_id is None
    assert first.meta == {"a": 1, "b": {"x": [1, 2]}}

    assert at(2).title == "First"
    assert at(3).meta == {"b": {"x": [1, 2]}, "c": "new"}
    assert at(4).updated_at == "2024-05-01T00:00:00Z"
    assert at(5).seq == 5 and at(5).updated_ms == 1005
    assert at(6).prompt_id == "p1"
    assert at(7).agent_session_id == "agent-1"
    eighth = at(8)
    assert eighth.title is None and eighth.meta == {"c": "new"}
    assert eighth.updated_at == "2024-05-01T00:00:00Z"  # omitted = unchanged
    assert at(9).prompt_id is None
    assert at(10).status == Status.STOPPED and not at(10).deleted
    eleventh = at(11)
    assert eleventh.updated_at is None and eleventh.title == "Second"
    last = at(12)
    assert last.meta == {} and last.title == "Second" and last.created_ms == 1001
    assert last.agent_session_id == "agent-1" and last.cwd == "/w/p"

    deleted = fold("t", "s", [*events, ev(13, {"type": EventType.DELETED})])
    assert deleted is not None and deleted.deleted and deleted.status == Status.DELETED
    assert deleted.seq == 13


def test_fold_deleted_clears_a_running_prompt() -> None:
    events = [
        ev(1, CREATED),
        ev(2, {"type": EventType.PROMPT, "promptId": "p9"}),
        ev(3, {"type": EventType.DELETED}),
    ]
    snap = fold("t", "s", events)
    assert snap is not None and snap.prompt_id is None and snap.deleted


def test_fold_ignores_unknown_event_types_and_other_updates() -> None:
    events = [
        ev(1, CREATED),
        ev(2, {"type": "something-new", "title": "x"}),
        ev(3, {"type": EventType.NOTICE, "text": "hi"}),
        ev(4, {"type": EventType.UPDATE, "update": {"sessionUpdate": "plan", "title": "no"}}),
    ]
    snap = fold("t", "s", events)
    assert snap is not None and snap.title is None and snap.seq == 4


meta_values = st.none() | json_values
meta_patch = st.none() | st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "acpBroker/x", "ünï"]), meta_values, max_size=4
)
info_patch = st.fixed_dictionaries(
    {},
    optional={
        "title": st.none() | st.text(max_size=12),
        "updatedAt": st.none() | st.sampled_from(["2024-01-01T00:00:00Z", "2030-12-31T23:59:59Z"]),
        "_meta": meta_patch,
    },
)


async def _fold_against_store(patches: list[dict[str, Any]]) -> None:
    store = connect(None)
    try:
        log = SessionLog(store)
        await log.create("tenant", "sess_p", {**CREATED, "meta": {"a": 0, "b": "keep"}})
        for patch in patches:
            body = {
                "type": EventType.UPDATE,
                "update": {"sessionUpdate": "session_info_update", **patch},
            }
            await log.append("tenant", "sess_p", body)
        events = await log.read("tenant", "sess_p")
        assert [e.seq for e in events] == list(range(1, len(patches) + 2))
        assert fold("tenant", "sess_p", events) == await log.snapshot("tenant", "sess_p")
    finally:
        await store.aclose()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(info_patch, max_size=8))
def test_fold_equals_the_snapshot_the_store_keeps(patches: list[dict[str, Any]]) -> None:
    asyncio.run(_fold_against_store(patches))


# -- index helpers ----------------------------------------------------------------------------


def test_member_sorts_newest_first_then_by_session_id() -> None:
    rows = [(1000, "b"), (3000, "a"), (1000, "a"), (2000, "z"), (3000, "c"), (0, "x")]
    ordered = sorted(rows, key=lambda r: member(*r))
    assert ordered == [(3000, "a"), (3000, "c"), (2000, "z"), (1000, "a"), (1000, "b"), (0, "x")]
    assert len(member(0, "s").split(":", 1)[0]) == 13
    assert member(5, "sess:with:colons").split(":", 1)[1] == "sess:with:colons"


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(st.integers(0, 10**13 - 1), st.text(min_size=1, max_size=8)),
    st.tuples(st.integers(0, 10**13 - 1), st.text(min_size=1, max_size=8)),
)
def test_member_order_property(a: tuple[int, str], b: tuple[int, str]) -> None:
    expected = (-a[0], a[1]) < (-b[0], b[1])
    # Redis BYLEX compares bytes; UTF-8 byte order equals code point order
    assert (member(*a).encode() < member(*b).encode()) == expected
    assert (member(*a) < member(*b)) == expected


def _page_by_partition(members: list[bytes], limit: int) -> Any:
    """A page read the plain way: every member partitioned at its mark."""
    split = [m.partition(b"\x01") for m in members[:limit]]
    if not split:
        return (b"", None, False)
    if not all(mark for _, mark, _ in split):
        return None
    return (b",".join(i for _, _, i in split), split[-1][0].decode(), len(members) > limit)


_infos = st.sampled_from([b'{"sessionId":"x"}', b"{}", b'{"a":"\x01"}', b""])
_laid_out = st.builds(
    lambda ms, n, info: member(ms, f"sess_{n:032x}").encode() + b"\x01" + info,
    st.integers(0, 10**13 - 1),
    st.integers(0, 2**128 - 1),
    _infos,
)
_other_members = st.builds(
    lambda ms, sid, info: member(ms, sid).encode() + info,
    st.integers(-(10**3), 10**13 - 1),
    st.text(st.sampled_from("sx0:"), max_size=40),
    st.sampled_from([b""]) | _infos.map(lambda i: b"\x01" + i),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_laid_out | _other_members, max_size=6), st.integers(1, 6))
def test_a_page_cut_at_the_position_length_is_the_page_partitioned(
    members: list[bytes], limit: int
) -> None:
    page = page_of(members, limit)
    expected = _page_by_partition(members, limit)
    assert (page if page is None else (page.infos, page.last, page.has_more)) == expected


@pytest.mark.parametrize(
    ("given_cwd", "expected"),
    [("/a/b/", "/a/b"), ("/a/b", "/a/b"), ("/a/b///", "/a/b"), ("/", "/"), ("//", "/")],
)
def test_normalize_cwd(given_cwd: str, expected: str) -> None:
    assert normalize_cwd(given_cwd) == expected


def test_a_pace_lets_in_what_its_bucket_holds_and_a_refund_gives_it_back() -> None:
    pace = Pace(rate=1.0)  # a full bucket: bursts of 2, refilled at 1 a second
    assert pace.take(2)
    assert not pace.take(1)  # nothing left, nothing spent (a second has not passed)
    pace.refund(2)
    assert pace.take(2)
    assert pace.spend(1) > 0  # owed: a wait before reading on


def test_rfc3339() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert rfc3339(1_700_000_000_999) == "2023-11-14T22:13:20.999Z"
    assert rfc3339(86_400_000 - 1) == "1970-01-01T23:59:59.999Z"


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**13 - 1))
def test_rfc3339_round_trips(ms: int) -> None:
    text = rfc3339(ms)
    assert len(text) == 24 and text.endswith("Z")
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert round(parsed.timestamp() * 1000) == ms
