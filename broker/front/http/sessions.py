"""The session list as the HTTP API and the MCP tool offer it: one service, one input model.

:class:`SessionsService` authenticates the caller, validates the inputs and reads a
page through the front's one listing service (:class:`~..listing.Listing`: its cache, its
reads ahead) from the store's one list path (:class:`~broker.store.query.SessionLister`).
REST (:mod:`.rest`) and MCP (:mod:`.mcp`) only translate its answers and its
:class:`~broker.errors.ApiError`\\ s for their wire.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...auth.authenticator import Authenticator as BrokerAuthenticator
from ...auth.credentials import Authenticator, Credentials, bearer_access, open_access
from ...config import Settings
from ...errors import ApiError, ErrorCode
from ...errors.store import query_refused
from ...ops import metrics
from ...store.client import Store
from ...store.cursors import CursorCodec
from ...store.errors import StoreError
from ...store.query import BadCursor, SessionLister, SessionPage, SessionQuery
from ..listing import Listing
from ..pages import Key, PageCache
from .tool_models import list_query

log = logging.getLogger(__name__)

TOOL_DESCRIPTION = (
    "Lists the project's sessions, newest first, with each one's id, status, kind and "
    "creation time. Use it to find a session again: the server keeps nothing between calls, "
    "so a model that has lost a sessionId gets it back here. All of its inputs are optional. "
    "Filter by status or kind, or search with q, and read a long list a page at a time "
    "with after."
)


class SessionsService:
    """Lists a caller's sessions: authenticate, validate, read one page."""

    def __init__(
        self,
        lister: SessionLister,
        authenticate: Authenticator,
        *,
        deadline: float = 30.0,
        pages: PageCache | None = None,
    ) -> None:
        self.lister = lister
        self.authenticate = authenticate
        self.deadline = deadline
        self.listing = Listing(CatalogPages(lister), pages)

    async def page(self, args: Mapping[str, Any], credentials: Credentials) -> SessionPage:
        """One page for these inputs, within :attr:`deadline` seconds; :class:`ApiError`
        when the call cannot be answered."""
        try:
            async with asyncio.timeout(self.deadline):
                tenant = (await self.authenticate(credentials)).tenant
                started = time.perf_counter()
                try:
                    return await self._page(tenant, list_query(args))
                finally:
                    metrics.list_seconds("http").observe(time.perf_counter() - started)
        except ApiError:
            raise
        except BadCursor as exc:
            raise query_refused(exc) from None
        except TimeoutError as exc:
            raise ApiError(
                ErrorCode.UNAVAILABLE,
                f"the session store did not answer within {self.deadline:g} s; retry later",
            ) from exc
        except StoreError as exc:
            raise ApiError(
                ErrorCode.UNAVAILABLE, f"the session store cannot be reached ({exc}); retry later"
            ) from exc
        except Exception as exc:
            log.exception("listing sessions failed")
            raise ApiError(ErrorCode.INTERNAL, "the sessions could not be listed") from exc

    async def _page(self, tenant: str, query: SessionQuery) -> SessionPage:
        """The page, through the front's one listing service (pages are not changed by their
        readers: REST and MCP render new objects from their rows)."""
        after = self.lister.position(tenant, query)
        return await self.listing.page(tenant, (query, after), wait_ahead=self.deadline / 2)


CatalogQuery = tuple[SessionQuery, str | None]
"""A REST or MCP list query and the position its page starts after (its cursor's)."""


@dataclass(frozen=True, slots=True)
class CatalogPages:
    """The pages of REST and MCP lists, as the listing service reads them (see
    :class:`~..listing.PageSource`)."""

    lister: SessionLister

    def key(self, tenant: str, query: CatalogQuery) -> Key:
        """Everything that shapes the page (the position the cursor holds, not the cursor:
        a page read ahead has none)."""
        q, after = query
        return (tenant, "catalog", q.statuses, q.kind, q.q, q.cwd, after, q.limit)

    async def read(self, tenant: str, query: CatalogQuery) -> tuple[SessionPage, str | None]:
        page = await self.lister.page_after(tenant, *query)
        return page, page.next_after

    def following(self, query: CatalogQuery, after: str) -> CatalogQuery:
        return query[0], after


def sessions_service(
    settings: Settings,
    store: Store,
    authenticator: BrokerAuthenticator | None = None,
    pages: PageCache | None = None,
) -> SessionsService:
    """The service for a node (its authenticator, its page cache) or for ``acp-broker mcp``
    over stdio (no authenticator: whoever runs it holds the Redis URL and acts as the
    settings' tenant; no page cache)."""
    lister = SessionLister(store, CursorCodec(settings.cursor_keys()))
    deadline = settings.request_timeout
    if authenticator is None or not authenticator.enabled:
        access = open_access(settings.tenant)
    else:
        access = bearer_access(authenticator)
    return SessionsService(lister, access, deadline=deadline, pages=pages)
