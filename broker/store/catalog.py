"""The catalog listings: every session by creation time, for the REST and MCP session list.

Beside the ACP listings (by ``updatedAt``, deleted sessions left out) the index keeps,
per tenant, listings ordered newest ``createdAt`` first (ties by session id) that
include deleted sessions. :func:`catalog_entries` says which of them a session is
in, so that each filter of ``GET /v1/sessions`` and the ``session_list`` tool is one
keyset range:

``c``                          every session, deleted ones included
``c:s:<STATUS>``               one per status
``c:k:<kind>``                 one per kind
``c:sk:<STATUS>:<kind>``       one per (status, kind)
``c:id:<p>``                   sessions whose id (``sess_`` left off) starts with ``p``,
                               for every prefix ``p`` of 1 to :data:`ID_PREFIX_CHARS` characters
``c:w:<word>``                 sessions whose ``userMetadata`` contains ``word``
``c:<ACP cwd listing>``        sessions in one working directory (``acp-broker sessions --cwd``)

Words (:func:`words`) are maximal runs of letters and digits, case-folded; a session's
metadata words (:func:`metadata_words`) are those of its ``userMetadata`` keys and values
at any depth, at most :data:`MAX_WORDS` of them, each at most :data:`MAX_WORD_CHARS`
long. This module is pure: names and words, no Redis.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from .events import SessionSnapshot

ALL_LISTING = "c"
SESSION_ID_PREFIX = "sess_"
ID_PREFIX_CHARS = 3
"""Prefix listings cover the first 1 to 3 characters after ``sess_`` (4,096 buckets of
random hex): a longer prefix is a short, filtered walk of its 3-character listing (about
250 sessions at a million). A fourth character's listings held one session each up to
some 65,000 sessions: a key per session, about 150 bytes of Redis each, archived sessions
too (``docs/redis-memory.md``). Listings of 4 characters written before are left to the
sessions' next projection or a rebuild (``acp-broker rebuild-index``); nothing reads them."""
MAX_WORDS = 64
MAX_WORD_CHARS = 64

_WORD = re.compile(r"[^\W_]+")


def status_listing(status: str) -> str:
    return f"c:s:{status}"


def kind_listing(kind: str) -> str:
    return f"c:k:{kind}"


def status_kind_listing(status: str, kind: str) -> str:
    return f"c:sk:{status}:{kind}"


def id_prefix_listing(prefix: str) -> str:
    """The listing of sessions whose id body starts with ``prefix`` (1 to
    :data:`ID_PREFIX_CHARS` characters)."""
    return f"c:id:{prefix}"


def word_listing(word: str) -> str:
    return f"c:w:{word}"


def cwd_catalog_listing(acp_cwd_listing: str) -> str:
    """The creation-time twin of an ACP cwd listing (same digest of the same cwd)."""
    return f"c:{acp_cwd_listing}"


def id_body(session_id: str) -> str:
    """A session id case-folded, without its ``sess_`` prefix: what id prefixes match."""
    folded = session_id.casefold()
    if folded.startswith(SESSION_ID_PREFIX):
        return folded[len(SESSION_ID_PREFIX) :]
    return folded


def words(text: str) -> list[str]:
    """The words of ``text``: runs of letters and digits, case-folded, in order."""
    return [w.casefold() for w in _WORD.findall(text)]


def metadata_words(meta: Mapping[str, Any]) -> list[str]:
    """The searchable words of a session's ``userMetadata``, deduplicated, in a stable order."""
    found: dict[str, None] = {}
    for text in _texts(meta):
        for word in words(text):
            if len(word) <= MAX_WORD_CHARS:
                found.setdefault(word)
                if len(found) >= MAX_WORDS:
                    return list(found)
    return list(found)


def _texts(value: Any) -> Iterator[str]:
    """Every key and scalar value in a JSON value, depth first, keys sorted."""
    if isinstance(value, Mapping):
        for key in sorted(value):
            yield str(key)
            yield from _texts(value[key])
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, bool):
        yield "true" if value else "false"
    elif value is not None:
        yield str(value)


def catalog_entries(
    snapshot: SessionSnapshot, by_created: str, acp_cwd_listing: str
) -> dict[str, str]:
    """The catalog listings a session is in, each mapped to ``by_created``, its member."""
    status, kind = str(snapshot.status), snapshot.kind
    names = [ALL_LISTING, status_listing(status), cwd_catalog_listing(acp_cwd_listing)]
    if kind:
        names += [kind_listing(kind), status_kind_listing(status, kind)]
    body = id_body(snapshot.session_id)
    names += [id_prefix_listing(body[:n]) for n in range(1, min(len(body), ID_PREFIX_CHARS) + 1)]
    names += [word_listing(word) for word in metadata_words(snapshot.meta)]
    return dict.fromkeys(names, by_created)
