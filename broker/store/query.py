"""The session list of ``GET /v1/sessions``, the ``session_list`` tool and ``acp-broker sessions``.

One list path: the front reads a list's inputs into a :class:`SessionQuery` (its input
model, ``broker/front/http/tool_models.py``); :class:`SessionLister` answers it from the
catalog listings (:mod:`.catalog`), newest ``createdAt`` first, ties by session id, in
keyset pages with signed cursors.

How each query is served:

- ``status`` and ``kind`` alone: one listing per status asked for (``c:sk:<STATUS>:<kind>``,
  ``c:s:<STATUS>``, ``c:k:<kind>`` or ``c``), merged by member order. Every member read
  is shown, so a page is O(log N + page size) at any depth, in one round trip.
- ``q``: the union of the sessions whose id starts with ``q`` (read from the id-prefix
  listing of its first characters) and those whose ``userMetadata`` holds every word of
  ``q`` (read from the listing of its longest word). What these listings hold beyond the
  match, and any ``status``/``kind`` filter given with ``q``, is filtered out row by row:
  a call examines at most :data:`SCAN_BUDGET` sessions, so a page can hold fewer than
  ``limit`` sessions (even none) while ``has_more`` is true; its cursor continues after
  the last session examined.

A cursor holds the member (the keyset position) of the last session shown or examined,
signed with a fingerprint of the tenant and the filters: it is refused
(``invalid_cursor``) by another tenant or with other filters. Changing ``limit`` between
pages is allowed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ..config import SESSION_KINDS
from .boundary import port
from .catalog import (
    ALL_LISTING,
    ID_PREFIX_CHARS,
    SESSION_ID_PREFIX,
    cwd_catalog_listing,
    id_body,
    id_prefix_listing,
    kind_listing,
    metadata_words,
    status_kind_listing,
    status_listing,
    word_listing,
    words,
)
from .client import Store, commands
from .cursors import CursorCodec, InvalidCursor, fingerprint
from .events import JsonObject
from .index import cwd_listing, decode_row, normalize_cwd
from .keys import TenantKeys

STATUS_VALUES = ("RUNNING", "STOPPED", "DELETED", "ERROR")
KIND_VALUES = SESSION_KINDS
LIMIT_DEFAULT = 20
LIMIT_MIN = 1
LIMIT_MAX = 100
Q_MAX_CHARS = 200
CURSOR_MAX_CHARS = 1000
SCAN_BUDGET = 1000
"""Most sessions one call examines when rows are filtered one by one (``q``, ``--cwd``)."""
FILTER_CHUNK = 200
CATALOG = "catalog"

Accept = Callable[[JsonObject], bool]


@dataclass(frozen=True, slots=True)
class SessionQuery:
    """A validated list request. ``cwd`` is for ``acp-broker sessions --cwd`` only."""

    statuses: tuple[str, ...] = ()
    kind: str | None = None
    q: str | None = None
    limit: int = LIMIT_DEFAULT
    after: str | None = None
    cwd: str | None = None

    def filters(self) -> JsonObject:
        """What a cursor is bound to (everything but ``limit`` and ``after``)."""
        q = self.q.casefold() if self.q is not None else None
        return {"status": list(self.statuses), "kind": self.kind, "q": q, "cwd": self.cwd}


@dataclass(frozen=True, slots=True)
class SessionPage:
    """One page: index rows, newest first, and the cursor of the next page (and the
    position it holds, for a reader of the next page that has no cursor to verify)."""

    rows: list[JsonObject]
    has_more: bool
    next_cursor: str | None
    next_after: str | None = None


# -- planning ---------------------------------------------------------------------------


def plan(query: SessionQuery) -> list[tuple[str, Accept | None]]:
    """The listings that serve ``query``, each with the rows it accepts (None = all)."""
    if query.q is not None and not _matches_every_id(query.q):
        return _q_sources(query.q, _residual(query))
    if query.cwd is not None:
        listing = cwd_catalog_listing(cwd_listing(query.cwd))
        return [(listing, _residual(SessionQuery(query.statuses, query.kind)))]
    kind = query.kind
    statuses: tuple[str | None, ...] = query.statuses
    if not statuses or len(statuses) == len(STATUS_VALUES):
        statuses = (None,)
    return [(_status_kind(status, kind), None) for status in statuses]


def _status_kind(status: str | None, kind: str | None) -> str:
    if status and kind:
        return status_kind_listing(status, kind)
    if status:
        return status_listing(status)
    return kind_listing(kind) if kind else ALL_LISTING


def _matches_every_id(q: str) -> bool:
    """True for ``s``, ``se`` … ``sess_``: every session id starts with it."""
    return SESSION_ID_PREFIX.startswith(q.casefold()) or not id_body(q)


def _residual(query: SessionQuery) -> Accept | None:
    """The status, kind and cwd filters as a row predicate (None when there are none)."""
    statuses, kind = set(query.statuses), query.kind
    cwd = normalize_cwd(query.cwd) if query.cwd is not None else None
    if not statuses and kind is None and cwd is None:
        return None

    def accept(row: JsonObject) -> bool:
        return (
            (not statuses or row.get("status") in statuses)
            and (kind is None or row.get("kind") == kind)
            and (cwd is None or normalize_cwd(str(row.get("cwd", ""))) == cwd)
        )

    return accept


def _q_sources(q: str, residual: Accept | None) -> list[tuple[str, Accept | None]]:
    body = id_body(q)

    def by_id(row: JsonObject) -> bool:
        return id_body(str(row["sessionId"])).startswith(body) and (
            residual is None or residual(row)
        )

    sources: list[tuple[str, Accept | None]] = [(id_prefix_listing(body[:ID_PREFIX_CHARS]), by_id)]
    wanted = set(words(q))
    if wanted:

        def by_words(row: JsonObject) -> bool:
            return wanted <= set(metadata_words(row.get("_meta") or {})) and (
                residual is None or residual(row)
            )

        sources.append((word_listing(max(sorted(wanted), key=len)), by_words))
    return sources


# -- reading ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Source:
    """One listing being read forward from a keyset position."""

    listing: str
    accept: Accept | None
    position: str | None
    buffer: deque[tuple[str, JsonObject | None]] = field(default_factory=deque)
    done: bool = False

    def takes(self, row: JsonObject | None) -> bool:
        return row is not None and (self.accept is None or self.accept(row))


class _MergedWalk:
    """Several listings walked together in member order, a member shared by two seen once."""

    def __init__(self, script: Any, tenant: str, sources: list[_Source], chunk: int) -> None:
        self.script = script
        self.keys = TenantKeys(tenant)
        self.sources = sources
        self.chunk = chunk

    async def next(self) -> tuple[str, JsonObject | None] | None:
        """The next member and its row (None when no listing accepts it); None at the end."""
        await self._fill()
        live = [s for s in self.sources if s.buffer]
        if not live:
            return None
        head = min(s.buffer[0][0] for s in live)
        shown: JsonObject | None = None
        for source in live:
            if source.buffer[0][0] == head:
                _, row = source.buffer.popleft()
                if source.takes(row):
                    shown = row
        return head, shown

    async def more(self) -> bool:
        """Whether any member is left."""
        await self._fill()
        return any(s.buffer for s in self.sources)

    async def _fill(self) -> None:
        empty = [s for s in self.sources if not s.buffer and not s.done]
        if not empty:
            return
        args: list[Any] = []
        for source in empty:
            args += [f"({source.position}" if source.position else "-", self.chunk]
        keys = [self.keys.rows] + [self.keys.index(s.listing) for s in empty]
        replies = await self.script(keys=keys, args=args)
        for n, source in enumerate(empty):
            members, rows = replies[2 * n], replies[2 * n + 1]
            source.done = len(members) < self.chunk
            if members:
                source.position = members[-1]
            for member, row in zip(members, rows, strict=False):
                source.buffer.append((member, decode_row(row) if row else None))


class BadCursor(ValueError):
    """A list query's cursor is forged, truncated, foreign or of another query (the HTTP
    layer answers it as ``invalid_cursor``: :func:`broker.errors.store.query_refused`)."""


@port
class SessionLister:
    """Answers session list queries for any tenant from the catalog listings."""

    def __init__(self, store: Store, cursors: CursorCodec, *, scan_budget: int = SCAN_BUDGET):
        self.store = store
        self.cursors = cursors
        self.scan_budget = scan_budget
        text = resources.files(__package__).joinpath("lua", "scan.lua").read_text()
        self._scan = commands(store).register_script(text)

    async def page(self, tenant: str, query: SessionQuery) -> SessionPage:
        """One page of ``query``'s sessions (:class:`BadCursor` if its cursor is bad)."""
        return await self.page_after(tenant, query, self.position(tenant, query))

    def position(self, tenant: str, query: SessionQuery) -> str | None:
        """The keyset position ``query``'s cursor holds (None: the first page);
        :class:`BadCursor` if it is not one of ours for this query."""
        return self._position(query.after, fingerprint(tenant, CATALOG, query.filters()))

    async def page_after(self, tenant: str, query: SessionQuery, after: str | None) -> SessionPage:
        """One page of ``query``'s sessions past position ``after`` (see :meth:`position`)."""
        mark = fingerprint(tenant, CATALOG, query.filters())
        sources = [_Source(name, accept, after) for name, accept in plan(query)]
        filtered = any(s.accept is not None for s in sources)
        chunk = max(query.limit + 1, FILTER_CHUNK) if filtered else query.limit + 1
        walk = _MergedWalk(self._scan, tenant, sources, chunk)
        shown: list[tuple[str, JsonObject]] = []
        last = after
        for _ in range(self.scan_budget):
            item = await walk.next()
            if item is None:
                return SessionPage([row for _, row in shown], False, None)
            last, row = item
            if row is not None:
                shown.append((last, row))
            if len(shown) > query.limit:
                return self._page(shown[: query.limit], shown[query.limit - 1][0], mark)
        if last is None or not await walk.more():
            return SessionPage([row for _, row in shown], False, None)
        return self._page(shown, last, mark)

    def _position(self, cursor: str | None, mark: str) -> str | None:
        if cursor is None:
            return None
        if len(cursor) > CURSOR_MAX_CHARS:
            raise BadCursor("the cursor is not one this server gave out")
        try:
            return self.cursors.decode(cursor, mark)
        except (InvalidCursor, ValueError) as exc:
            raise BadCursor(str(exc)) from None

    def _page(self, shown: list[tuple[str, JsonObject]], position: str, mark: str) -> SessionPage:
        rows = [row for _, row in shown]
        return SessionPage(rows, True, self.cursors.encode(position, mark), position)
