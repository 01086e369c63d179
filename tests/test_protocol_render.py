"""broker.protocol.render and v2_render: frames from stored text, session/update frames."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import jsonrpc, v2_render, v2_translate
from broker.protocol.render import StoredUpdates, session_update_frames
from broker.store.events import EventType, LogEvent, dumps, event_of

from .support.strategies import json_values

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
