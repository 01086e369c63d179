"""One listing service: a page of a list, from the front's cache, a read ahead, or the store.

ACP ``session/list`` (:mod:`.acp.listing`), ``GET /v1/sessions`` and the MCP
``session_list`` tool (:mod:`.http.sessions`) all ask :meth:`Listing.page`. Each list says
what it reads through a :class:`PageSource` (its store read, its cache key, the query of the
page after one); the service does the rest, the same for every list:

1. a page the cache holds (:class:`~.pages.PageCache`) is answered from memory;
2. a page being read ahead is waited for (a bounded while), not read twice;
3. otherwise it is read from the store, kept (read again when its tenant changes), and,
   once this step's reply is written, the page after it is read ahead.

ACP answers a kept page, and reads a missing one, in the step that read the request where it
can (:class:`~.acp.listing.AcpListing`): an optimisation over :meth:`Listing.page` that
keeps and reads ahead as it does (:meth:`Listing.keep`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from .pages import Key, PageCache

Q = TypeVar("Q")
"""A list's query: what says which page to read (its position included)."""
V = TypeVar("V")
"""What is kept of a page and answered (the page, or its reply's text)."""
V_co = TypeVar("V_co", covariant=True)


class PageSource(Protocol[Q, V_co]):
    """What one list reads, and how its pages are keyed."""

    def key(self, tenant: str, query: Q) -> Key | None:
        """The cache key of ``query``'s page (None: it is not kept)."""
        ...

    async def read(self, tenant: str, query: Q) -> tuple[V_co, str | None]:
        """``query``'s page, read from the store, and the position the page after it starts
        after (None: it is the last)."""
        ...

    def following(self, query: Q, after: str) -> Q:
        """The query of the page that starts after position ``after``."""
        ...


class Listing(Generic[Q, V]):
    """The pages of one list, for any caller (see the module's docstring)."""

    def __init__(self, source: PageSource[Q, V], pages: PageCache | None) -> None:
        self.source = source
        self.pages = pages

    async def page(self, tenant: str, query: Q, *, wait_ahead: float) -> V:
        """``query``'s page for ``tenant``: kept, read ahead (waited for ``wait_ahead``
        seconds at most, so that a read ahead stuck in a slow store leaves time for a read of
        its own), or read now."""
        pages = self.pages
        key = self.source.key(tenant, query) if pages is not None else None
        if pages is None or key is None:
            read, _ = await self.source.read(tenant, query)
            return read
        kept: V | None = pages.hit(key)
        if kept is None:
            landed = pages.landed(key, wait_ahead)
            if landed is not None:
                await landed
                kept = pages.hit(key)
        if kept is None:
            return await self.read_missing(tenant, query)
        return kept

    async def read_missing(self, tenant: str, query: Q) -> V:
        """``query``'s page, missing from the cache (counted so), read from the store now and
        kept (a caller that waited for a read ahead already: it does not wait again)."""
        pages = self.pages
        key = self.source.key(tenant, query) if pages is not None else None
        if pages is None or key is None:
            read, _ = await self.source.read(tenant, query)
            return read
        pages.missed()
        return await self.read(tenant, query, key, pages.begin())

    async def read(self, tenant: str, query: Q, key: Key | None, token: int | None) -> V:
        """``query``'s page read from the store now (the cache missed it: ``key``, the
        ``token`` taken before the read), then kept as :meth:`keep` keeps it."""
        value, after = await self.source.read(tenant, query)
        self.keep(tenant, query, key, token, value, after)
        return value

    def keep(
        self,
        tenant: str,
        query: Q,
        key: Key | None,
        token: int | None,
        value: V,
        after: str | None,
    ) -> None:
        """Keep ``value``, read for ``query`` under ``key`` (None: not kept) from ``token`` on,
        read again when its tenant changes; and have the page after position ``after`` read
        ahead once this step's reply is written (its wait is no part of this answer's)."""
        pages = self.pages
        if pages is None or key is None:
            return
        pages.put(key, token, value, functools.partial(self._read_again, tenant, query))
        if after is not None:
            pages.soon(self._read_ahead_after, tenant, query, after)

    def _read_ahead_after(self, tenant: str, query: Q, after: str) -> None:
        self.read_ahead(tenant, self.source.following(query, after))

    def read_ahead(self, tenant: str, query: Q) -> None:
        """Have ``query``'s page read ahead (a client paging through asks for it next); when
        it is first asked for, the one after it is read ahead in turn."""
        pages = self.pages
        key = self.source.key(tenant, query) if pages is not None else None
        if pages is None or key is None:
            return

        async def read() -> tuple[V, Callable[[], None] | None]:
            value, after = await self.source.read(tenant, query)
            if after is None:
                return value, None
            following = self.source.following(query, after)
            return value, functools.partial(self.read_ahead, tenant, following)

        pages.read_ahead(key, read)

    async def _read_again(self, tenant: str, query: Q) -> V:
        """``query``'s page read again (a kept page's tenant changed: see ``PageCache``)."""
        value, _ = await self.source.read(tenant, query)
        return value
