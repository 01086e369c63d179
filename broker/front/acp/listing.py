"""ACP ``session/list``: the front's listing service, over the index's ACP listings.

Every page is asked of :class:`~..listing.Listing` (cache, read ahead, store). What this
module adds is an optimisation of ACP's hot path (a window polling its first page, a client
paging through): :meth:`AcpListing.answer_now` answers in the step that read the request
(:mod:`.dispatch`), with no task,

- a page the cache holds, at once;
- a page being read ahead, when that read lands (:class:`~.dispatch.PendingRead`);
- a missing page, from the callback of its read, sent on the store's shared connection
  while one is open and its reply's timeout bounds the read within the request's deadline;

and hands anything else to :meth:`AcpListing.session_list` in a task (a traced request, no
shared connection open, a page that did not land). Pages read in the step are kept and read ahead
as the service keeps them (:meth:`~..listing.Listing.keep`).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from ... import fastjson
from ...config import Settings
from ...ops import tracing
from ...protocol.jsonrpc import JsonObject, Request, invalid_params
from ...store.cursors import CursorCodec, InvalidCursor, fingerprint
from ...store.errors import StoreError, connection_lost
from ...store.index import ACP_LISTING, Page, SessionIndex, cwd_listing, normalize_cwd
from ..listing import Listing
from ..pages import Key, PageCache
from .dispatch import IN_TASK, InTask, PendingRead, StepAnswer
from .params import absolute


@dataclass(frozen=True, slots=True)
class ListQuery:
    """A checked ``session/list``: its params as given, the listing it reads, the position
    it starts after and its cursors' fingerprint."""

    params: JsonObject
    listing: str
    after: str | None
    mark: str


@dataclass(frozen=True, slots=True)
class AcpPages:
    """The pages of ACP ``session/list``, as the listing service reads them: kept as their
    reply's text (a hit costs no splice, no cursor), keyed by the params as given."""

    index: SessionIndex
    cursors: CursorCodec
    settings: Settings  # its list_page_size, read at each ask (it may be set at run time)

    def key(self, tenant: str, query: ListQuery) -> Key | None:
        return page_key(tenant, query.params, self.settings.list_page_size)

    async def read(self, tenant: str, query: ListQuery) -> tuple[bytes, str | None]:
        limit = self.settings.list_page_size
        page = await self.index.page(tenant, query.listing, query.after, limit)
        return self.text(page, query.mark), next_after(page)

    def following(self, query: ListQuery, after: str) -> ListQuery:
        params = {**query.params, "cursor": self.cursors.encode(after, query.mark)}
        return ListQuery(params, query.listing, after, query.mark)

    def text(self, page: Page, mark: str) -> bytes:
        """The ``session/list`` result of ``page``, spliced from the rows' SessionInfo texts
        as read (one fragment, not one per row: each one costs the encoder a call back into
        Python), in UTF-8: it goes into the reply's frame as it is."""
        if not (page.has_more and page.last is not None):
            return b"".join((b'{"sessions":[', page.infos, b"]}"))
        cursor = fastjson.dumps(self.cursors.encode(page.last, mark)).encode()
        return b"".join((b'{"sessions":[', page.infos, b'],"nextCursor":', cursor, b"}"))


class AcpListing:
    """``session/list`` for ACP connections of one front."""

    def __init__(
        self,
        settings: Settings,
        index: SessionIndex,
        cursors: CursorCodec,
        pages: PageCache | None,
    ) -> None:
        self.settings = settings
        self.index = index
        self.cursors = cursors
        self.pages = pages
        self.source = AcpPages(index, cursors, settings)
        self.listing: Listing[ListQuery, bytes] = Listing(self.source, pages)

    async def session_list(self, tenant: str, params: JsonObject) -> fastjson.Fragment:
        """A ``session/list`` answered in a task: through the listing service."""
        query = self.query(tenant, params)
        wait = self.settings.request_timeout / 2
        return fastjson.Fragment(await self.listing.page(tenant, query, wait_ahead=wait))

    async def _read_missing(self, tenant: str, params: JsonObject) -> fastjson.Fragment:
        query = self.query(tenant, params)
        return fastjson.Fragment(await self.listing.read_missing(tenant, query))

    def answer_now(self, tenant: str, params: JsonObject) -> StepAnswer | None:
        """The answer to a ``session/list`` (of an initialized connection, allowed to list)
        that may come without a task (see the module's docstring); None for the rest."""
        pages = self.pages
        key = None
        if pages is not None and pages.serving:
            key = page_key(tenant, params, self.settings.list_page_size)
            text = pages.hit(key) if key is not None else None
            if text is not None:
                return functools.partial(_given, fastjson.Fragment(text))
        bound = self.index.page_timeout
        if bound is None or bound > self.settings.request_timeout or tracing.active():
            return None
        if pages is not None and key is not None and pages.reading_ahead(key):
            return functools.partial(self._joined, pages, key, bound)
        return functools.partial(self._read_now, tenant)

    def _joined(
        self, pages: PageCache, key: Key, bound: float, conn: Any, request: Request
    ) -> PendingRead | InTask:
        """``session/list`` of a page being read ahead: answered once that read has landed,
        not read a second time (a client paging through faster than a read ahead lands).
        Waited for at most ``bound`` seconds; a page not kept by then (its tenant changed,
        its read failed or is slow) is read as any miss, in a task with what is left of the
        request's deadline."""
        landed = pages.landed(key, bound)
        if landed is None:  # it landed between the two looks: read as any miss
            return IN_TASK
        missing = InTask(functools.partial(self._read_missing, conn.tenant, request.params))

        def finish(_: asyncio.Future[Any]) -> fastjson.Fragment | InTask:
            text = pages.hit(key)
            if text is None:
                return missing  # waited for already: read, not waited for again
            return fastjson.Fragment(text)

        return PendingRead(landed, finish)

    def _read_now(self, tenant: str, conn: Any, request: Request) -> PendingRead | InTask:
        """``session/list`` answered from the callback of its page's read, sent now on the
        store's shared connection (or, none being open, in a task)."""
        query = self.query(tenant, request.params)
        limit = self.settings.list_page_size
        read = self.index.begin_page(tenant, query.listing, query.after, limit)
        if read is None:
            return IN_TASK
        pages, key = self.pages, page_key(tenant, request.params, limit)
        token = None
        if pages is not None and key is not None:
            pages.missed()
            token = pages.begin()

        async def again() -> fastjson.Fragment:
            # Read here, not dispatched: this ask's miss is counted (once) above.
            page = await self.index.page(tenant, query.listing, query.after, limit)
            return keep(page)

        def keep(page: Page) -> fastjson.Fragment:
            text = self.source.text(page, query.mark)
            self.listing.keep(tenant, query, key, token, text, next_after(page))
            return fastjson.Fragment(text)

        def finish(future: asyncio.Future[Any]) -> fastjson.Fragment | InTask:
            try:
                page = self.index.read_page(read, limit)
            except StoreError as exc:
                if not connection_lost(exc):  # a stall's timeout, an error reply, the breaker
                    raise  # answered at once, as the client's would be
                return InTask(again)  # read again, on a fresh connection
            if page is None:  # members of an earlier format: they need the rows too
                return InTask(again)
            return keep(page)

        return PendingRead(read[1], finish, read[0].in_step)

    def query(self, tenant: str, params: JsonObject) -> ListQuery:
        """A ``session/list``'s query, from its params (checked: -32602)."""
        cwd = params.get("cwd")
        if cwd is not None and type(cwd) is not str:
            absolute(cwd, "cwd")  # raises: only a string is a path (nor can it be a key)
        listing, mark = acp_listing(tenant, cwd)
        after = None
        cursor = params.get("cursor")
        if cursor is not None:
            if not isinstance(cursor, str):
                raise invalid_params("cursor must be a string")
            try:
                after = self.cursors.decode(cursor, mark)
            except InvalidCursor as exc:
                raise invalid_params(f"invalid cursor: {exc}") from None
        return ListQuery(params, listing, after, mark)


@functools.lru_cache(maxsize=4096)
def acp_listing(tenant: str, cwd: str | None) -> tuple[str, str]:
    """The listing a ``session/list``'s ``cwd`` (checked: -32602, never kept) names, and its
    cursors' fingerprint, computed once per tenant and cwd as given: the checks, the path's
    normal form and its listing's digest were 4% of an uncached front's samples a page."""
    if cwd is None:
        return ACP_LISTING, fingerprint(tenant, "acp", {})
    cwd = normalize_cwd(absolute(cwd, "cwd"))
    return cwd_listing(cwd), fingerprint(tenant, "acp", {"cwd": cwd})


def page_key(tenant: str, params: JsonObject, limit: int) -> tuple[Any, ...] | None:
    """The page cache's key of a ``session/list``: the tenant, the ``cwd`` and ``cursor`` as
    given, the page size; None unless both are strings or absent (the handler refuses them).

    The texts, not what they decode to: a page is kept only once its request was checked,
    and the same texts check the same way for the same tenant (the cursor keys are fixed
    for the front's life), so a hit needs no cursor verification."""
    cwd, cursor = params.get("cwd"), params.get("cursor")
    if (cwd is None or type(cwd) is str) and (cursor is None or type(cursor) is str):
        return (tenant, "acp", cwd, cursor, limit)
    return None


def next_after(page: Page) -> str | None:
    """The position the page after ``page`` starts after (None: it is the last)."""
    return page.last if page.has_more else None


def _given(page: fastjson.Fragment, conn: Any, request: Request) -> Any:
    """A :data:`~.dispatch.StepAnswer` known before it was asked for (a kept page)."""
    return page
