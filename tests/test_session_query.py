"""The one list path behind GET /v1/sessions and session_list: filters, q, pages, cursors."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from broker.errors import ApiError, ErrorCode
from broker.errors.store import query_refused
from broker.front.http.tool_models import list_query
from broker.store.cursors import CursorCodec, fingerprint
from broker.store.events import EventType, Status
from broker.store.index import ACP_LISTING, SessionIndex
from broker.store.log import SessionLog
from broker.store.query import (
    CATALOG,
    STATUS_VALUES,
    BadCursor,
    SessionLister,
    SessionPage,
)

from .support.seed import BASE_MS, Seeded, newest_first, seed_many, seed_session

KINDS = ("browser", "shell", "combined")


def lister(store: Any, **options: Any) -> SessionLister:
    return SessionLister(store, CursorCodec([b"test-secret"]), **options)


async def walk(
    source: SessionLister, inputs: dict[str, Any], tenant: str = "default"
) -> tuple[list[str], list[SessionPage]]:
    """Every page of a listing, following the cursors."""
    ids: list[str] = []
    pages: list[SessionPage] = []
    after = None
    while True:
        query = list_query({**inputs, **({"after": after} if after else {})})
        page = await source.page(tenant, query)
        pages.append(page)
        ids += [row["sessionId"] for row in page.rows]
        assert page.has_more == (page.next_cursor is not None)
        if not page.has_more:
            return ids, pages
        after = page.next_cursor
        assert len(pages) < 2000, "the walk does not end"


def expected(sessions: list[Seeded], statuses: tuple[str, ...] = (), kind: str | None = None):
    return newest_first(
        [
            s
            for s in sessions
            if (not statuses or s.status in statuses) and (kind is None or s.kind == kind)
        ]
    )


async def test_every_status_and_kind_combination_pages_newest_first(store: Any) -> None:
    grid = list(itertools.product(STATUS_VALUES, KINDS, range(3)))
    # Creation times repeat (ties broken by id) and interleave across statuses and kinds.
    sessions = await seed_many(
        store,
        len(grid),
        lambda i: {
            "status": grid[i][0],
            "kind": grid[i][1],
            "created_ms": BASE_MS + (i * 7919) % 11 * 1000,
        },
    )
    source = lister(store)
    subsets = [
        combo
        for n in range(len(STATUS_VALUES) + 1)
        for combo in itertools.combinations(STATUS_VALUES, n)
    ]
    for statuses, kind in itertools.product(subsets, (None, *KINDS)):
        inputs: dict[str, Any] = {"limit": 2}
        if statuses:
            inputs["status"] = ",".join(statuses)
        if kind:
            inputs["kind"] = kind
        ids, pages = await walk(source, inputs)
        assert ids == expected(sessions, statuses, kind), inputs
        assert all(len(p.rows) == 2 for p in pages[:-1]), inputs  # full pages when not filtering


async def test_1000_sessions_with_equal_creation_times_page_exactly_once(store: Any) -> None:
    sessions = await seed_many(
        store,
        1000,
        lambda i: {
            "status": STATUS_VALUES[i % 4],
            "kind": KINDS[i % 3],
            "meta": {"batch": f"group{i % 5}"},
        },
    )
    assert {s.created_ms for s in sessions} == {BASE_MS}
    source = lister(store, scan_budget=150)
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"limit": 100}, lambda s: True),
        ({"limit": 37, "status": "RUNNING,STOPPED"}, lambda s: s.status in ("RUNNING", "STOPPED")),
        (
            {"limit": 100, "status": "DELETED,ERROR,RUNNING", "kind": "shell"},
            lambda s: s.status != "STOPPED" and s.kind == "shell",
        ),
        (
            {"limit": 30, "q": "Group3", "status": "ERROR"},
            lambda s: s.status == "ERROR" and s.meta["batch"] == "group3",
        ),
    ]
    for inputs, wanted in cases:
        ids, pages = await walk(source, inputs)
        assert ids == newest_first([s for s in sessions if wanted(s)]), inputs
    # The unfiltered walk: 10 full pages.
    ids, pages = await walk(source, {"limit": 100})
    assert len(pages) == 10 and [len(p.rows) for p in pages] == [100] * 10


async def test_q_matches_a_session_id_prefix_with_or_without_sess(store: Any) -> None:
    ids = [
        "sess_ab12cd34" + "0" * 24,
        "sess_ab12cd99" + "0" * 24,
        "sess_ab13" + "0" * 28,
        "sess_ff00" + "0" * 28,
    ]
    made = [
        await seed_session(store, session_id=sid, created_ms=BASE_MS + n * 1000)
        for n, sid in enumerate(ids)
    ]
    source = lister(store)

    async def search(q: str, **more: Any) -> list[str]:
        found, _ = await walk(source, {"q": q, "limit": 1, **more})
        return found

    everything = newest_first(made)
    assert await search(ids[0]) == [ids[0]]
    assert await search("sess_ab12") == [ids[1], ids[0]]
    assert await search("ab12") == [ids[1], ids[0]]
    assert await search("AB12CD") == [ids[1], ids[0]]  # longer than the prefix listings
    assert await search("ab12cd3") == [ids[0]]
    assert await search("sess_ab1") == [ids[2], ids[1], ids[0]]
    assert await search("a") == [ids[2], ids[1], ids[0]]
    for every in ("s", "sess", "sess_", "SESS_"):
        assert await search(every) == everything, every
    assert await search("ab99") == []
    assert await search("sess_zz") == []


async def test_q_matches_whole_words_of_user_metadata_ignoring_case(store: Any) -> None:
    # Ids of our own: ``q`` matches an id's prefix too, and a random id beginning with "42"
    # or "123" would be found by those searches (as it should).
    rich = await seed_session(
        store,
        session_id="sess_" + "e" * 32,
        created_ms=BASE_MS + 2000,
        meta={
            "customer": "ACME Corp",
            "ticket": "TICKET-123",
            "tags": ["alpha", "beta"],
            "nested": {"city": "Zürich", "count": 42, "flag": True},
        },
    )
    other = await seed_session(
        store,
        session_id="sess_" + "d" * 32,
        created_ms=BASE_MS + 1000,
        status=Status.STOPPED,
        meta={"customer": "acme"},
    )
    globex = await seed_session(
        store, session_id="sess_" + "c" * 32, created_ms=BASE_MS, meta={"customer": "Globex"}
    )
    source = lister(store)

    async def search(q: str, **more: Any) -> list[str]:
        found, _ = await walk(source, {"q": q, **more})
        return found

    both = [rich.session_id, other.session_id]
    assert await search("acme") == both
    assert await search("ACME") == both
    assert await search("acme corp") == [rich.session_id]
    assert await search("Corp, ACME!") == [rich.session_id]  # every word, in any order
    assert await search("acm") == []  # whole words, not substrings
    assert await search("ticket-123") == [rich.session_id]
    assert await search("123") == [rich.session_id]
    assert await search("ZÜRICH") == [rich.session_id]  # nested values, case-folded
    assert await search("42") == [rich.session_id]
    assert await search("true") == [rich.session_id]
    assert await search("customer") == [*both, globex.session_id]  # keys are text too
    assert await search("alpha beta") == [rich.session_id]
    assert await search("gamma") == []
    assert await search("acme", status="STOPPED") == [other.session_id]
    assert await search("acme", status="RUNNING", kind="combined") == [rich.session_id]
    assert await search("acme", kind="shell") == []


async def test_q_is_the_union_of_id_prefix_and_metadata_matches(store: Any) -> None:
    by_id = await seed_session(store, session_id="sess_cafe" + "1" * 28, created_ms=BASE_MS)
    by_meta = await seed_session(store, created_ms=BASE_MS + 1000, meta={"note": "cafe"})
    by_both = await seed_session(
        store, session_id="sess_cafe" + "2" * 28, created_ms=BASE_MS + 500, meta={"x": "cafe"}
    )
    found, _ = await walk(lister(store), {"q": "cafe", "limit": 1})
    assert found == [by_meta.session_id, by_both.session_id, by_id.session_id]


async def test_a_sparse_q_pages_within_the_scan_budget_and_misses_nothing(store: Any) -> None:
    sessions = await seed_many(
        store,
        160,
        lambda i: {
            "created_ms": BASE_MS + i,
            "meta": {"word": "needle" if i % 37 == 0 else "hay"},
            "status": Status.ERROR if i % 2 else Status.RUNNING,
        },
    )
    source = lister(store, scan_budget=40)
    found, pages = await walk(source, {"q": "hay", "status": "ERROR", "limit": 100})
    want = newest_first([s for s in sessions if s.meta["word"] == "hay" and s.status == "ERROR"])
    assert found == want
    assert len(pages) > 1 and all(len(p.rows) <= 40 for p in pages)
    found, pages = await walk(source, {"q": "needle", "kind": "combined"})
    assert found == newest_first([s for s in sessions if s.meta["word"] == "needle"])
    # Nothing matches: empty pages that still say where to continue, then the end.
    found, pages = await walk(source, {"q": "hay", "status": "STOPPED"})
    assert found == [] and len(pages) == 4 and pages[0].rows == [] and pages[0].has_more


async def test_deleted_sessions_stay_listed_and_status_changes_move_sessions(store: Any) -> None:
    log, index = SessionLog(store), SessionIndex(store)
    one = await seed_session(store, created_ms=BASE_MS)
    two = await seed_session(store, created_ms=BASE_MS + 1000)
    source = lister(store)

    async def ids(**inputs: Any) -> list[str]:
        return (await walk(source, inputs))[0]

    assert await ids(status="RUNNING") == [two.session_id, one.session_id]
    await log.append("default", one.session_id, {"type": EventType.STATUS, "status": "STOPPED"})
    await log.append("default", two.session_id, {"type": EventType.DELETED})
    for sid in (one.session_id, two.session_id):
        snapshot = await log.snapshot("default", sid)
        await index.project(dataclasses.replace(snapshot, created_ms=BASE_MS))
    assert await ids(status="RUNNING") == []
    assert await ids(status="STOPPED") == [one.session_id]
    assert await ids(status="DELETED") == [two.session_id]
    assert set(await ids()) == {one.session_id, two.session_id}
    # ACP session/list's listing leaves the deleted one out.
    acp = await index.page("default", ACP_LISTING, None, 10)
    assert [row["sessionId"] for row in acp.sessions()] == [one.session_id]
    page = await source.page("default", list_query({"status": "deleted"}))
    assert page.rows[0]["status"] == "DELETED" and page.rows[0]["createdAt"].endswith("Z")


async def test_tenants_see_only_their_sessions_and_cursors(store: Any) -> None:
    await seed_many(store, 5, lambda i: {"created_ms": BASE_MS + i})
    theirs = await seed_many(store, 3, lambda i: {"tenant": "other", "created_ms": BASE_MS + i})
    source = lister(store)
    assert (await walk(source, {}, tenant="other"))[0] == newest_first(theirs)
    page = await source.page("default", list_query({"limit": 2}))
    assert page.next_cursor is not None
    with pytest.raises(BadCursor) as caught:
        await source.page("other", list_query({"limit": 2, "after": page.next_cursor}))
    assert query_refused(caught.value).code == ErrorCode.INVALID_CURSOR


async def test_cursors_are_bound_to_their_filters_and_refuse_forgeries(store: Any) -> None:
    await seed_many(store, 6, lambda i: {"created_ms": BASE_MS + i, "kind": "shell"})
    source = lister(store)
    first = await source.page("default", list_query({"limit": 2, "kind": "shell"}))
    cursor = first.next_cursor
    assert cursor is not None
    # Another limit is fine; other filters are not.
    more = await source.page("default", list_query({"limit": 3, "kind": "shell", "after": cursor}))
    assert len(more.rows) == 3
    payload, tag = cursor.split(".")
    foreign = CursorCodec([b"test-secret"]).encode(
        "0:x", fingerprint("other", CATALOG, list_query({"kind": "shell"}).filters())
    )
    bad_cursors = [
        ({"kind": "browser"}, cursor),
        ({"kind": "shell", "status": "RUNNING"}, cursor),
        ({"kind": "shell", "q": "x"}, cursor),
        ({}, cursor),
        ({"kind": "shell"}, cursor[:-2]),
        ({"kind": "shell"}, payload + "." + tag[::-1]),
        ({"kind": "shell"}, "garbage"),
        ({"kind": "shell"}, "."),
        ({"kind": "shell"}, "x" * 5000),
        ({"kind": "shell"}, foreign),
    ]
    for inputs, bad in bad_cursors:
        with pytest.raises(BadCursor) as caught:
            await source.page("default", list_query({**inputs, "after": bad}))
        error = query_refused(caught.value)
        assert (error.code, error.message) == (ErrorCode.INVALID_CURSOR, str(caught.value))


@pytest.mark.parametrize(
    "inputs",
    [
        {"limit": 0},
        {"limit": 101},
        {"limit": -1},
        {"limit": "ten"},
        {"limit": 2.5},
        {"limit": True},
        {"status": "FINISHED"},
        {"status": "RUNNING,FINISHED"},
        {"status": 3},
        {"kind": "car"},
        {"q": "x" * 201},
        {"sort": "asc"},
    ],
)
def test_bad_inputs_are_invalid_arguments(inputs: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as caught:
        list_query(inputs)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT


def test_inputs_are_normalized() -> None:
    query = list_query(
        {
            "status": " stopped , RUNNING,running ",
            "kind": "Shell",
            "limit": "7",
            "q": "  x ",
            "after": "",
        }
    )
    assert query.statuses == ("RUNNING", "STOPPED")
    assert (query.kind, query.limit, query.q, query.after) == ("shell", 7, "x", None)
    assert list_query({"status": "", "kind": None, "limit": None}) == list_query({})
    assert list_query({}).limit == 20
    assert list_query({"limit": 1}).limit == 1 and list_query({"limit": 100}).limit == 100


@pytest.mark.parametrize("limit", ["²", "١٢", "1e2", "-1", "0", "1001", "ten", " 5 5 "])
def test_a_limit_that_is_not_a_plain_number_in_range_is_an_invalid_argument(limit: str) -> None:
    with pytest.raises(ApiError) as raised:
        list_query({"limit": limit})
    assert raised.value.code == ErrorCode.INVALID_ARGUMENT


def test_a_limit_may_come_with_spaces_around_it() -> None:
    assert list_query({"limit": " 25 "}).limit == 25
