"""broker.store.index's pure helpers: members, pages, paths, times."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.index import member, normalize_cwd, page_of, rfc3339

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
