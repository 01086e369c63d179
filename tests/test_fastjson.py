"""The hot-path JSON (orjson with a standard-library fallback) reads and writes what ``json``
does, lone surrogates and big integers included."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from broker import fastjson

CHARS = st.lists(
    st.one_of(st.characters(), st.sampled_from(["\ud800", "\udfff", "\u2028", '"', "\\"])),
    max_size=12,
).map("".join)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | CHARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(CHARS, inner, max_size=4),
    max_leaves=20,
)


def _std(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    return isinstance(value, list) and any(_has_float(v) for v in value)


@given(VALUES)
def test_dumps_is_the_standard_compact_json(value: Any) -> None:
    """The same text, but for how a float is spelled (orjson writes 1e-7, json 1e-07)."""
    ours = fastjson.dumps(value)
    assert json.loads(ours) == json.loads(_std(value))
    if not _has_float(value):
        assert ours == _std(value)


@given(VALUES)
def test_loads_reads_what_json_reads(value: Any) -> None:
    for text in (_std(value), json.dumps(value)):
        assert fastjson.loads(text) == json.loads(text)
    ascii_text = json.dumps(value).encode()  # bytes, as pub/sub may hand them over
    assert fastjson.loads(ascii_text) == json.loads(ascii_text)


def test_non_string_keys_fall_back_to_json() -> None:
    assert fastjson.dumps({1: "a"}) == '{"1":"a"}'


@given(VALUES, VALUES)
def test_a_fragment_is_spliced_as_the_json_it_holds(outer: Any, inner: Any) -> None:
    """Also where orjson refuses the rest (a big integer, a lone surrogate): the standard
    library's fallback parses the fragment and writes it again."""
    spliced = fastjson.dumps({"outer": outer, "inner": [fastjson.Fragment(fastjson.dumps(inner))]})
    assert json.loads(spliced) == json.loads(_std({"outer": outer, "inner": [inner]}))


def test_integers_past_64_bits_are_read_exactly() -> None:
    """orjson would read them as floats, silently."""
    for number in (2**64, -(2**63) - 1, 10**30, -(10**25)):
        text = f'{{"n":[{number}],"s":"{number}"}}'
        assert fastjson.loads(text) == fastjson.loads(text.encode()) == json.loads(text)
        assert fastjson.loads(text)["n"][0] == number
