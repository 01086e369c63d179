"""broker.store.cursors: signed list cursors."""

from __future__ import annotations

import base64
import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.cursors import CursorCodec, InvalidCursor, fingerprint

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
