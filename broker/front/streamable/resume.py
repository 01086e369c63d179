"""Where a reader of a connection's scope starts again: the one cursor rule of both
transports (a GET's ``Last-Event-ID``, a reliable WebSocket's ``afterCursor``).

A cursor is the integer a message got in its scope's stream (:mod:`broker.store.http_links`),
written in decimal. Resuming after cursor N sends every message after N, in order, once:
so N must be one this stream gave out, and the message after it must still be kept.
"""

from __future__ import annotations

from ...store.http_links import HttpLinks

CURSOR_DIGITS = 18
"""The most digits a cursor has (below 2**63: a stream entry ID's part)."""


class CursorRefused(Exception):
    """A cursor to resume after that cannot be: not one of the stream's (``oldest`` None),
    or further back than it keeps (``oldest``: its oldest kept cursor, 0 when none is)."""

    def __init__(self, reason: str, oldest: int | None = None) -> None:
        super().__init__(reason)
        self.oldest = oldest

    @property
    def gap(self) -> bool:
        """The cursor is the stream's, but what followed it is no longer kept."""
        return self.oldest is not None


def parse_cursor(text: object) -> int | None:
    """The cursor written as ``text`` (None: it is no cursor)."""
    if not isinstance(text, str) or not text.isdigit() or len(text) > CURSOR_DIGITS:
        return None
    return int(text)


async def resume_after(links: HttpLinks, conn_id: str, scope: str, text: object) -> int:
    """The cursor to read ``scope`` after, resuming after cursor ``text``; raises
    :class:`CursorRefused` when that cannot be done with nothing lost or sent twice."""
    after = parse_cursor(text)
    if after is None:
        raise CursorRefused("not a cursor of this stream")
    _, given = await links.reader(conn_id, scope)
    if after > given:
        raise CursorRefused("past the stream's last cursor")
    first = await links.first(conn_id, scope)
    if after < given and (first is None or first > after + 1):
        raise CursorRefused("what followed the cursor is no longer kept", first or 0)
    return after
