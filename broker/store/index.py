"""The materialized session index: per-tenant rows and ordered listings.

Each listing is a sorted set whose members all score 0 and sort by their text,
which starts with the session's keyset position ``<inverted time>:<session id>``,
so newest first with ties broken by session id, and a page after a position is
one ``ZRANGE … BYLEX LIMIT``: O(log N + page size) at any depth.

A stored row is two JSON texts on two lines: the session as ACP's
``session/list`` shows it (a ``SessionInfo``, rendered once, when projected,
and spliced into replies as it is), then what the other listings add (see
:func:`encode_row`). The ACP listings' members carry that ``SessionInfo`` too,
after the position (:func:`stored_member`), so a ``session/list`` page is that
one native command and nothing else: no script, no row lookups (a script that
fetched the rows cost Redis 90 µs a page, the bare ``ZRANGE`` 3; see
``docs/architecture.md``). The price is a second copy of each ``SessionInfo``, in the
listing of every session only: a cwd's listing holds bare positions, and its page reads
the rows too (:func:`carries_info`).

Projection is idempotent: a session's row and entries are a function of its
snapshot, written with compare-and-set on a per-session version that records
the snapshot seq and the entries written, so replays and racing projectors
converge on the newest snapshot.

Every write is announced: after it, in the same pipeline where the write is one, the
tenant's name is published on :data:`~.keys.INDEX_CHANNEL` (once per tenant per batch), and
the hook :attr:`.IndexAnnouncer.changed` (a front's page cache) is told at once. A tenant whose
announcement could not be sent is owed one, sent with the next write's.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any, TypedDict

from redis.exceptions import NoScriptError, RedisError

from .. import fastjson
from .boundary import port, store_error
from .catalog import catalog_entries
from .client import Store, commands, is_cluster
from .direct import reconnecting, store_calls
from .errors import StoreError
from .events import JsonObject, SessionSnapshot, Status, dumps
from .index_announce import IndexAnnouncer
from .keys import INDEX_CHANNEL, TenantKeys
from .raw import RawConnection

_VERSIONS_KEPT = 100_000
"""How many sessions' versions a projecting index remembers (about 200 bytes each)."""
_TIME_CEILING = 10**13 - 1  # ms; keeps inverted times at 13 digits until the year 2286
ACP_LISTING = "acp"  # every session not deleted, by updatedAt
# In an ACP listing's member, between the position and the SessionInfo JSON. Neither JSON
# text nor a session id (``sess_<hex>``) holds a control character, so the first one splits
# the two, and members sort by position as before.
_INFO_MARK = "\x01"
_INFO_MARK_BYTES = _INFO_MARK.encode()
# A range bound of ``(<position><_PAST>`` falls after every member stored at that position
# (the bare position of the earlier format too) and before the next position's.
_PAST = "\x02"


def rfc3339(ms: int) -> str:
    """An RFC 3339 UTC timestamp with milliseconds."""
    return f"{_second(ms // 1000)}{ms % 1000:03d}Z"


@functools.lru_cache(maxsize=1024)
def _second(seconds: int) -> str:
    """The part of :func:`rfc3339` before the milliseconds (the same for a second's worth of
    events; a fresh one costs a ``strftime``, which was 4% of a projector's samples)."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")


def member(ms: int, session_id: str) -> str:
    """The index member that sorts a session newest-first by ``ms``, then by id."""
    return f"{_TIME_CEILING - ms:013d}:{session_id}"


def is_acp_listing(listing: str) -> bool:
    """Whether ``listing`` is one ACP's ``session/list`` reads (every session, or one cwd's)."""
    return listing == ACP_LISTING or listing.startswith(_ACP_PREFIX)


_ACP_PREFIX = ACP_LISTING + ":"


def carries_info(listing: str) -> bool:
    """Whether ``listing``'s members carry the ``SessionInfo`` a page shows (the listing of
    every session); a cwd's listing holds bare positions, whose page reads the rows too
    (``HMGET``): a second copy of each ``SessionInfo``, about 400 bytes a session kept in
    Redis for as long as the session, cost more than that round trip (lua/touch.lua decides
    the same by the key's name)."""
    return listing == ACP_LISTING


def stored_member(listing: str, position: str, info: str) -> str:
    """The member a session is stored under in ``listing``: its position, and in the ACP
    listing of every session also the ``SessionInfo`` JSON text a page shows of it."""
    return f"{position}{_INFO_MARK}{info}" if carries_info(listing) else position


def lower_bound(after: str | None) -> str:
    """The ``ZRANGE … BYLEX`` lower bound of the members past position ``after`` (all of
    them when None)."""
    return f"({after}{_PAST}" if after else "-"


PageRead = tuple[RawConnection, "asyncio.Future[Any]"]
"""A page read in flight on the own client's connection (:meth:`SessionIndex.begin_page`)."""


def page_command(tenant: str, listing: str, after: str | None, limit: int) -> tuple[Any, ...]:
    """The one ``ZRANGE`` that reads a page of an ACP listing (one member more than
    ``limit``: whether a next page exists)."""
    low = lower_bound(after)
    return ("ZRANGE", TenantKeys(tenant).index(listing), low, "+", "BYLEX", "LIMIT", 0, limit + 1)


Split = list[tuple[bytes, bytes, bytes]]
"""A page's members, each as (position, the info mark or b"", its ``SessionInfo`` or b"")."""


def rows_command(tenant: str, members: list[bytes], limit: int) -> tuple[Split, tuple[Any, ...]]:
    """The page's members split at their info mark, and the ``HMGET`` of the rows of those
    that are bare positions (a cwd's listing holds only those)."""
    split = [m.partition(_INFO_MARK_BYTES) for m in members[:limit]]
    bare = [at.partition(b":")[2].decode() for at, mark, _ in split if not mark]
    return split, ("HMGET", TenantKeys(tenant).rows, *bare)


def page_with_rows(split: Split, rows: list[Any], more: bool) -> Page:
    """The page of ``split`` (see :func:`rows_command`), each bare member's ``SessionInfo``
    taken from its row in ``rows`` (the ``HMGET``'s reply); a gone row is left out."""
    replies = iter(rows)
    infos = []
    for _, mark, info in split:
        if not mark:
            row = next(replies)
            if not row:
                continue
            text = row.decode() if isinstance(row, bytes) else row
            info = session_info_json(text).encode()
        infos.append(info)
    return Page(b",".join(infos), split[-1][0].decode(), more)


def page_of(members: list[bytes], limit: int) -> Page | None:
    """The page a listing's members make (each carries its ``SessionInfo`` after the
    position); None when some are bare positions, written before members carried it."""
    page = members[:limit]
    if not page:
        return Page(b"", None, False)
    more = len(members) > limit
    # Every position the broker writes is as long (an inverted time of 13 digits, a
    # ``sess_`` id): each member's info is cut at the same offset, in C (map, itemgetter),
    # once the mark is seen there in every one; a third of the page's cost of a partition
    # each. Any other member (a bare position of the earlier format, another length) is
    # partitioned where its mark is.
    try:
        marks_in_place = not bytes(map(_MARK_BYTE, page)).strip(_INFO_MARK_BYTES)
    except IndexError:  # a member no longer than a position: a bare one
        marks_in_place = False
    if marks_in_place:
        return Page(b",".join(map(_INFO_PART, page)), page[-1][:_POSITION_BYTES].decode(), more)
    split = [m.partition(_INFO_MARK_BYTES) for m in page]
    if not all([mark for _, mark, _ in split]):
        return None
    return Page(b",".join([info for _, _, info in split]), split[-1][0].decode(), more)


_POSITION_BYTES = len(member(0, "sess_" + "0" * 32))
_MARK_BYTE = operator.itemgetter(_POSITION_BYTES)
_INFO_PART = operator.itemgetter(slice(_POSITION_BYTES + 1, None))


def _as_bytes(members: list[Any]) -> list[bytes]:
    """Members as the bare connection reads them (bytes), whichever way they were read."""
    return [m.encode() for m in members] if members and type(members[0]) is str else members


def normalize_cwd(cwd: str) -> str:
    """A cwd as the index compares it: trailing separators removed (but ``/`` stays)."""
    stripped = cwd.rstrip("/")
    return stripped or "/"


def cwd_listing(cwd: str) -> str:
    """The listing of the sessions whose cwd is exactly ``cwd``."""
    digest = hashlib.sha256(normalize_cwd(cwd).encode()).hexdigest()[:32]
    return f"acp:cwd:{digest}"


def row_of(snapshot: SessionSnapshot) -> JsonObject:
    """Everything a listing shows about a session."""
    return {
        "sessionId": snapshot.session_id,
        "cwd": snapshot.cwd,
        "additionalDirectories": snapshot.additional_directories,
        "title": snapshot.title,
        "updatedAt": snapshot.updated_at or rfc3339(snapshot.updated_ms),
        "createdAt": rfc3339(snapshot.created_ms),
        "status": snapshot.status,
        "kind": snapshot.kind,
        "agent": snapshot.agent,
        "_meta": snapshot.meta,
    }


AGENT_META = "acpBroker/agent"
STATUS_META = "acpBroker/status"
"""The ``SessionInfo._meta`` keys under which ``session/list`` says which configured agent
runs a session and its status (``RUNNING``, ``STOPPED``, ``ERROR``), as REST and MCP do:
ACP's ``SessionInfo`` has no field for either, and ``_meta`` is where a list says more."""
_BROKER_META = (AGENT_META, STATUS_META)


def session_info(row: JsonObject) -> JsonObject:
    """A row as ACP's ``session/list`` shows it: a ``SessionInfo`` (empty fields left out),
    the session's own metadata in ``_meta`` beside the broker's agent and status."""
    info: JsonObject = {"sessionId": row["sessionId"], "cwd": row["cwd"]}
    if row.get("additionalDirectories"):
        info["additionalDirectories"] = row["additionalDirectories"]
    if row.get("title") is not None:
        info["title"] = row["title"]
    info["updatedAt"] = row["updatedAt"]
    meta = {k: v for k, v in (row.get("_meta") or {}).items() if k not in _BROKER_META}
    if row.get("agent"):
        meta[AGENT_META] = row["agent"]
    if row.get("status"):
        meta[STATUS_META] = row["status"]
    if meta:
        info["_meta"] = meta
    return info


_ROW_DEFAULTS: JsonObject = {"additionalDirectories": [], "title": None, "_meta": {}}


def encode_row(row: JsonObject) -> str:
    """A row as the index stores it: its ``SessionInfo`` JSON, a newline, the rest's JSON.

    ``session/list`` then splices the first line into its reply without parsing it
    (the busiest listing does no JSON work per row). Compact JSON never holds a raw
    newline, so the first one splits the two.
    """
    info = session_info(row)
    rest = {k: v for k, v in row.items() if k not in info and v != _ROW_DEFAULTS.get(k, ())}
    return f"{dumps(info)}\n{dumps(rest)}"


def decode_row(text: str) -> JsonObject:
    """A stored row, whole (a row stored as one JSON object, as before, is read too)."""
    info, newline, rest = text.partition("\n")
    if not newline:
        return dict(fastjson.loads(text))
    row = {**_ROW_DEFAULTS, **fastjson.loads(info), **fastjson.loads(rest)}
    meta = row["_meta"]
    if any(key in meta for key in _BROKER_META):  # the listing's, not the session's
        row["_meta"] = {k: v for k, v in meta.items() if k not in _BROKER_META}
    return row


def session_info_json(text: str) -> str:
    """The ``SessionInfo`` JSON of a stored row, as it goes into a reply."""
    info, newline, _ = text.partition("\n")
    return info if newline else dumps(session_info(fastjson.loads(text)))


def entries_of(snapshot: SessionSnapshot) -> dict[str, str]:
    """The listings a session belongs to, each with the member it sorts under.

    The ACP listings (by updatedAt) leave deleted sessions out; the catalog listings
    (by createdAt, see :mod:`.catalog`) keep them.
    """
    acp_cwd = cwd_listing(snapshot.cwd)
    by_created = member(snapshot.created_ms, snapshot.session_id)
    entries = catalog_entries(snapshot, by_created, acp_cwd)
    if snapshot.status == Status.DELETED:
        return entries
    by_updated = member(snapshot.updated_ms, snapshot.session_id)
    return {ACP_LISTING: by_updated, acp_cwd: by_updated, **entries}


def stored_entries(entries: Mapping[str, str], row: str) -> dict[str, str]:
    """The member each of a session's ``entries`` (listing: position) is stored under, its
    stored ``row`` (:func:`encode_row`) given."""
    info = row.partition("\n")[0]
    return {listing: stored_member(listing, at, info) for listing, at in entries.items()}


def members_of(snapshot: SessionSnapshot) -> dict[str, str]:
    """The listings a session is stored in, each with its member there."""
    return stored_entries(entries_of(snapshot), encode_row(row_of(snapshot)))


@dataclass(frozen=True, slots=True)
class Version:
    """What the index holds for a session: the snapshot seq and the entries written.

    Stored compactly (:meth:`encode`): a session's entries share two positions (its
    updatedAt's, in the ACP listings, and its createdAt's, in the catalog's), so each
    position is written once, followed by the listings stored under it. That is a quarter
    of the JSON object it was (1,125 bytes for a session with a title and two metadata
    words), and the tenant's versions hash holds one per session, archived ones too. A
    version stored as JSON, as before, is read all the same.
    """

    seq: int
    entries: dict[str, str]

    def encode(self) -> str:
        """``~<seq>`` (then ``:<id>`` when every position ends with ``:<id>``, the
        session's id, left off them) then, per distinct position, ``<GS><position><RS>``
        and the listings stored under it, split by spaces; JSON when a listing's name could
        be mistaken for a separator."""
        grouped: dict[str, list[str]] = {}
        for name, position in self.entries.items():
            grouped.setdefault(position, []).append(name)
        if _SEPARATORS.search("".join(self.entries)) or _SEPARATORS.search("".join(grouped)):
            return dumps({"q": self.seq, "e": self.entries})
        suffixes = {at.partition(":")[2] for at in grouped}
        [suffix] = suffixes if len(suffixes) == 1 else [""]
        head = f"{_VERSION_MARK}{self.seq}:{suffix}" if suffix else f"{_VERSION_MARK}{self.seq}"
        cut = -len(suffix) - 1 if suffix else None
        parts = [
            f"{_GROUP_SEP}{at[:cut]}{_NAMES_SEP}{' '.join(names)}" for at, names in grouped.items()
        ]
        return head + "".join(parts)

    @classmethod
    def decode(cls, text: str | None) -> Version | None:
        """The stored version, or None when there is none or it is unreadable (a rebuild or
        the next projection then rewrites it)."""
        if not text:
            return None
        if text.startswith(_VERSION_MARK):
            return cls._decode_compact(text)
        try:
            data = json.loads(text)
            return cls(int(data["q"]), {str(k): str(v) for k, v in dict(data["e"]).items()})
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    @classmethod
    def _decode_compact(cls, text: str) -> Version | None:
        head, *groups = text[len(_VERSION_MARK) :].split(_GROUP_SEP)
        seq, colon, suffix = head.partition(":")
        entries: dict[str, str] = {}
        for group in groups:
            at, mark, names = group.partition(_NAMES_SEP)
            if not mark:
                return None
            at = f"{at}:{suffix}" if colon else at
            entries.update(dict.fromkeys(names.split(" ") if names else (), at))
        try:
            return cls(int(seq), entries)
        except ValueError:
            return None


_VERSION_MARK = "~"  # never the first character of a JSON object
_GROUP_SEP = "\x1d"
_NAMES_SEP = "\x1e"
_SEPARATORS = re.compile("[ \x1d\x1e]")
"""Listing names are words, digests, statuses and kinds, positions are digits and ids:
none holds these. Should one ever, its version is written as JSON."""


@dataclass(frozen=True, slots=True)
class Page:
    """One page of an ACP listing; ``last`` is the keyset position to continue after."""

    infos: bytes  # the rows' SessionInfo JSON texts (UTF-8) joined by commas, to splice
    last: str | None
    has_more: bool

    def sessions(self) -> list[JsonObject]:
        """The page's ``SessionInfo`` objects, parsed."""
        return list(fastjson.loads(b"[" + self.infos + b"]"))


@dataclass(frozen=True, slots=True)
class Notice:
    """What a change-feed notice says of one event: its session, its seq, and for an event
    that changes nothing the index shows but the seq and updatedAt (see
    :func:`~.events.is_index_neutral`) the updatedAt it set (``ms``; None: it set none)."""

    tenant: str
    session_id: str
    seq: int
    neutral: bool
    ms: int | None = None


def _script(name: str) -> str:
    return resources.files(__package__).joinpath("lua", name).read_text()


def _write_call(
    keys: TenantKeys,
    session_id: str,
    raw: str,
    old: Version | None,
    new: Version,
    row: str,
    *,
    force: bool = False,
) -> tuple[list[str], list[Any]]:
    """The keys and arguments of ``lua/project.lua`` for one session (see there).

    Only the entries that change are removed and written again: a member that keeps its
    position keeps its text in every listing but the ACP ones, whose members carry the
    ``SessionInfo`` (an event that only moves ``updatedAt`` touches 2 listings, not 14).
    ``force`` writes every entry (a rebuild repairs what it finds).
    """
    old_entries = old.entries if old else {}
    if not force:
        gone = {k: at for k, at in old_entries.items() if _rewritten(k, at, new.entries)}
        kept = {k: at for k, at in new.entries.items() if _rewritten(k, at, old_entries)}
        old_entries, new_entries = gone, kept
    else:
        new_entries = new.entries
    script_keys = [keys.rows, keys.versions]
    script_keys += [keys.index(name) for name in old_entries]
    script_keys += [keys.index(name) for name in new_entries]
    args: list[Any] = [session_id, raw, new.encode(), row, len(old_entries)]
    args += list(old_entries.values())
    args += list(stored_entries(new_entries, row).values())
    return script_keys, args


def _rewritten(listing: str, position: str, other: Mapping[str, str]) -> bool:
    """Whether an entry must be removed (or written) given the other version's entries."""
    return other.get(listing) != position or is_acp_listing(listing)


@dataclass(frozen=True, slots=True)
class _TouchCall:
    """One session's part of a ``lua/touch.lua`` call, and what it leaves the index holding."""

    key: tuple[str, str]
    text: str
    version: Version
    derived: bool
    keys: list[str]
    args: list[Any]


_NOTHING: Any = object()
"""A session whose notices the index holds already."""


class IndexDump(TypedDict):
    """Everything the index holds for a tenant: its rows (session id -> row text) and its
    listings' members (listing key -> members, in order)."""

    rows: dict[str, str]
    listings: dict[str, list[str]]


@port
class SessionIndex:
    """Reads and writes the per-tenant session index."""

    def __init__(self, redis: Store, *, changed: Callable[[str], None] | None = None) -> None:
        self.redis = commands(redis)
        self.announcer = IndexAnnouncer(redis, changed)
        self._project = self.redis.register_script(_script("project.lua"))
        self._touch = self.redis.register_script(_script("touch.lua"))
        # Replies as bytes: a page's texts go on to the client's frame as they were read.
        self._calls = store_calls(redis, encoding=None)
        self._direct = self._calls.direct
        self._versions: dict[tuple[str, str], tuple[str, Version | None, bool | None]] = {}
        """(tenant, session) -> the version last written or read by :meth:`project_many`
        (its text, itself) and whether the row written shows the updated time as its
        ``updatedAt`` (True; False: an explicit one; None: not known, only read)."""

    async def project(
        self, snapshot: SessionSnapshot, *, force: bool = False, announce: bool = True
    ) -> bool:
        """Bring the index up to ``snapshot``; False if it already held this or a newer one.

        ``force`` rewrites the session's entries even at the same seq (rebuilds).
        ``announce=False`` leaves the announcement to the caller
        (:meth:`.IndexAnnouncer.announce`), which writes many sessions of a tenant.
        """
        keys = TenantKeys(snapshot.tenant)
        new = Version(snapshot.seq, entries_of(snapshot))
        row = encode_row(row_of(snapshot))
        while True:
            raw = await self.redis.hget(keys.versions, snapshot.session_id)
            old = Version.decode(raw)
            if old is not None and old.seq >= snapshot.seq and not force:
                return False
            call = _write_call(keys, snapshot.session_id, raw or "", old, new, row, force=force)
            if await self._write(snapshot.tenant, *call, announce=announce):
                self._remember(snapshot, new)
                return True

    async def project_many(
        self, snapshots: Sequence[SessionSnapshot]
    ) -> list[tuple[SessionSnapshot, Exception]]:
        """:meth:`project` each snapshot, in one round trip for all of them (what a projector
        does with a batch of change notices): one pipeline of ``project.lua`` calls, each
        against the version this index last wrote for the session (or read, once, for a
        session it has not met). A call that finds another version there (another writer
        came between) is made again alone, reading afresh. Returns the snapshots that could
        not be rendered into rows, with the error; the others are projected all the same.

        On a cluster the tenants' keys lie in different slots, and redis-py's cluster
        pipeline runs no scripts: the projections run side by side instead.
        """
        if is_cluster(self.redis):
            return await self._project_each(snapshots)
        await self._learn_versions(snapshots)
        failed: list[tuple[SessionSnapshot, Exception]] = []
        calls: list[tuple[SessionSnapshot, Version, list[str], list[Any]]] = []
        for snapshot in snapshots:
            raw, old, _ = self._versions[(snapshot.tenant, snapshot.session_id)]
            if old is not None and old.seq >= snapshot.seq:
                continue
            try:
                new = Version(snapshot.seq, entries_of(snapshot))
                row = encode_row(row_of(snapshot))
            except (ValueError, KeyError, TypeError) as exc:
                failed.append((snapshot, exc))
                continue
            keys = TenantKeys(snapshot.tenant)
            call = _write_call(keys, snapshot.session_id, raw, old, new, row)
            calls.append((snapshot, new, *call))
        if calls:
            await self._write_many(calls)
        return failed

    async def touch_many(
        self, notices: Mapping[tuple[str, str], Sequence[Notice]]
    ) -> list[tuple[str, str]]:
        """Bring sessions (tenant, session id) up to their change notices (in feed order)
        without reading their snapshots or rendering their rows, where the notices allow it:
        a session whose notices past the version this index last wrote for it are all
        neutral and follow it without a gap is patched in place by ``lua/touch.lua`` (its
        row's ``updatedAt``, its version, its two ACP members), one call for the batch.
        Rendering rows and entries was most of a projector's CPU per event, and most events
        are agent updates that move only ``updatedAt``. Returns the sessions to project from
        their snapshots (:meth:`project_many`): the rest, and any whose version another
        writer changed meanwhile."""
        full: list[tuple[str, str]] = []
        calls: list[_TouchCall] = []
        for key, found in notices.items():
            call = self._touch_call(key, found)
            if call is None:
                full.append(key)
            elif call is not _NOTHING:
                calls.append(call)
        if not calls:
            return full
        if is_cluster(self.redis):  # one call per tenant: a tenant's keys share a slot
            by_tenant: dict[str, list[_TouchCall]] = {}
            for call in calls:
                by_tenant.setdefault(call.key[0], []).append(call)
            groups = list(by_tenant.values())
            replies = await asyncio.gather(*(self._run_touch(group) for group in groups))
            outcomes = [
                (c, r)
                for g, rs in zip(groups, replies, strict=True)
                for c, r in zip(g, rs, strict=True)
            ]
        else:
            outcomes = list(zip(calls, await self._run_touch(calls), strict=True))
        for call, done in outcomes:
            if done == 1:
                self._versions[call.key] = (call.text, call.version, call.derived)
            else:
                self._versions.pop(call.key, None)
                full.append(call.key)
        return full

    def _touch_call(self, key: tuple[str, str], notices: Sequence[Notice]) -> _TouchCall | None:
        """What ``lua/touch.lua`` must do for one session; None when its notices need a
        full projection, :data:`_NOTHING` when the index holds them already."""
        raw, old, derived = self._versions.get(key, ("", None, None))
        if old is None or derived is None:
            return None
        seq, ms = old.seq, None
        for notice in notices:
            if notice.seq <= old.seq:
                continue  # projected already
            if not notice.neutral or notice.seq != seq + 1:
                return None
            seq = notice.seq
            if notice.ms is not None:
                ms = notice.ms
        if seq == old.seq:
            return _NOTHING
        entries, listings, position = old.entries, [], ""
        if ms is not None:
            position = member(ms, key[1])
            listings = [name for name in entries if is_acp_listing(name)]
            if listings:
                entries = {n: position if n in listings else at for n, at in entries.items()}
        version = Version(seq, entries)
        text = version.encode()
        tenant_keys = TenantKeys(key[0])
        script_keys = [tenant_keys.rows, tenant_keys.versions]
        script_keys += [tenant_keys.index(name) for name in listings]
        updated = rfc3339(ms) if ms is not None and derived else ""
        args: list[Any] = [key[1], raw, text, updated, position, len(listings)]
        args += [old.entries[name] for name in listings]
        return _TouchCall(key, text, version, derived, script_keys, args)

    async def _run_touch(self, calls: Sequence[_TouchCall]) -> list[int]:
        """One ``lua/touch.lua`` call for ``calls`` (one slot's, on a cluster), then their
        tenants announced (on the own client's connection, in the same write)."""
        keys: list[str] = []
        args: list[Any] = [len(calls)]
        for call in calls:
            keys += call.keys
            args += call.args
        tenants = {call.key[0] for call in calls}
        try:
            direct = self._direct
            if direct is not None:
                # A write, made again on a fresh connection after a lost one: the version
                # check makes a second one write nothing (and the session is projected afresh).
                names, owed = self.announcer.announcing(tenants)
                touch = ("EVALSHA", self._touch.sha, len(keys), *keys, *args)
                announce = [("SPUBLISH", INDEX_CHANNEL, name) for name in names]
                replies = await reconnecting(
                    lambda: direct.loading(self._touch, lambda: direct.calls(touch, *announce))
                )
                self.announcer.paid(owed)
                return list(replies[0])
            done = list(await self._touch(keys=keys, args=args))
        finally:
            self.announcer.tell(tenants)
        await self.announcer.announce(tenants)
        return done

    async def _project_each(
        self, snapshots: Sequence[SessionSnapshot]
    ) -> list[tuple[SessionSnapshot, Exception]]:
        outcomes = await asyncio.gather(
            *(self.project(snapshot, announce=False) for snapshot in snapshots),
            return_exceptions=True,
        )
        await self.announcer.announce({snapshot.tenant for snapshot in snapshots})
        failed: list[tuple[SessionSnapshot, Exception]] = []
        for snapshot, outcome in zip(snapshots, outcomes, strict=True):
            if isinstance(outcome, ValueError | KeyError | TypeError):
                failed.append((snapshot, outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
        return failed

    async def _learn_versions(self, snapshots: Sequence[SessionSnapshot]) -> None:
        """Read the stored versions of the sessions this index has not met yet."""
        unknown = [s for s in snapshots if (s.tenant, s.session_id) not in self._versions]
        if not unknown:
            return
        self._bound_versions(len(unknown))
        async with self.redis.pipeline(transaction=False) as pipe:
            for snapshot in unknown:
                pipe.hget(TenantKeys(snapshot.tenant).versions, snapshot.session_id)
            raws: list[str | None] = await pipe.execute()
        for snapshot, raw in zip(unknown, raws, strict=True):
            self._versions[(snapshot.tenant, snapshot.session_id)] = (
                raw or "",
                Version.decode(raw),
                None,
            )

    def _remember(self, snapshot: SessionSnapshot, new: Version, text: str = "") -> None:
        """Note the version just written for ``snapshot`` (its text, when made already)."""
        self._bound_versions(1)
        derived = snapshot.updated_at is None
        key = (snapshot.tenant, snapshot.session_id)
        self._versions[key] = (text or new.encode(), new, derived)

    def _bound_versions(self, more: int) -> None:
        if len(self._versions) + more > _VERSIONS_KEPT:
            self._versions.clear()  # a bound, not a cache policy: a miss costs one read

    async def _write_many(
        self, calls: Sequence[tuple[SessionSnapshot, Version, list[str], list[Any]]]
    ) -> None:
        sha = self._project.sha
        tenants = {snapshot.tenant for snapshot, _, _, _ in calls}
        names, owed = self.announcer.announcing(tenants)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for _, _, script_keys, args in calls:
                    pipe.evalsha(sha, len(script_keys), *script_keys, *args)
                for name in names:  # after the writes, in the same round trip
                    pipe.spublish(INDEX_CHANNEL, name)
                replies = await pipe.execute(raise_on_error=False)
        finally:
            self.announcer.tell(tenants)
        written, published = replies[: len(calls)], replies[len(calls) :]
        if any(isinstance(reply, Exception) for reply in published):
            self.announcer.owe(names)
        else:
            self.announcer.paid(owed)
        again: set[str] = set()
        for (snapshot, new, _, args), done in zip(calls, written, strict=True):
            key = (snapshot.tenant, snapshot.session_id)
            if done == 1:
                self._remember(snapshot, new, args[2])
                continue
            if isinstance(done, Exception) and not isinstance(done, NoScriptError):
                # Its failure may hide writes made after the announcement.
                self.announcer.owe(tenants)
                raise done
            # Someone else wrote first, or the script is not loaded (a restarted Redis):
            # the one-at-a-time path reads afresh and loads the script.
            self._versions.pop(key, None)
            await self.project(snapshot, announce=False)
            again.add(snapshot.tenant)
        if again or self.announcer.owing():
            await self.announcer.announce(again)

    async def remove(self, tenant: str, session_id: str) -> None:
        """Take a session out of the index entirely."""
        keys = TenantKeys(tenant)
        self._versions.pop((tenant, session_id), None)
        while True:
            raw = await self.redis.hget(keys.versions, session_id)
            empty = Version(0, {})
            call = _write_call(keys, session_id, raw or "", Version.decode(raw), empty, "")
            if await self._write(tenant, *call, announce=True):
                return

    async def _write(
        self, tenant: str, script_keys: list[str], args: list[Any], *, announce: bool
    ) -> bool:
        """One ``project.lua`` call of ``tenant``'s (True: it wrote), the local hook told;
        ``announce``: and announced, in the same round trip where one can carry both."""
        if announce and not is_cluster(self.redis):  # on a cluster the channel's slot differs
            return await self._write_announced(tenant, script_keys, args)
        try:
            written = bool(await self._project(keys=script_keys, args=args))
        finally:
            self.announcer.tell((tenant,))
        if written and announce:
            await self.announcer.announce((tenant,))
        return written

    async def _write_announced(self, tenant: str, script_keys: list[str], args: list[Any]) -> bool:
        """:meth:`_write` with the announcement after the write in its pipeline (one round
        trip, not two; sent even when the version check wrote nothing: a needless drop of
        cached pages, where a later one would be a stale page meanwhile)."""
        names, owed = self.announcer.announcing((tenant,))
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.evalsha(self._project.sha, len(script_keys), *script_keys, *args)
                for name in names:
                    pipe.spublish(INDEX_CHANNEL, name)
                written, *published = await pipe.execute(raise_on_error=False)
        except BaseException:
            self.announcer.owe(names)
            self.announcer.tell((tenant,))
            raise
        if any(isinstance(reply, Exception) for reply in published):
            self.announcer.owe(names)
        else:
            self.announcer.paid(owed)
        if isinstance(written, NoScriptError):  # nothing written: the client's way loads it
            written = await self._write(tenant, script_keys, args, announce=False)
            if written:
                await self.announcer.announce((tenant,))
            return written
        self.announcer.tell((tenant,))
        if isinstance(written, Exception):
            raise written
        return bool(written)

    async def page(self, tenant: str, listing: str, after: str | None, limit: int) -> Page:
        """Up to ``limit`` sessions of the ACP listing ``listing`` that sort after position
        ``after``, as ``session/list`` shows them: one ``ZRANGE``, whose members carry the
        ``SessionInfo`` texts, joined here into one string."""
        command = page_command(tenant, listing, after, limit)
        members = _as_bytes(await self._read(*command))
        page = page_of(members, limit)
        return page if page is not None else await self._bare_page(tenant, members, limit)

    def begin_page(
        self, tenant: str, listing: str, after: str | None, limit: int
    ) -> PageRead | None:
        """:meth:`page`'s read sent now, for a caller that answers in a callback: the future
        of its reply (then :meth:`read_page`); None when the own client's shared connection
        is not open (or the store has no own client), or the listing holds bare positions (a
        cwd's): :meth:`page` reads it."""
        if self._direct is None or not carries_info(listing):
            return None
        return self._direct.request(*page_command(tenant, listing, after, limit))

    @property
    def page_timeout(self) -> float | None:
        """Seconds a :meth:`begin_page` read may wait for its reply (None: there is none)."""
        return self._direct.timeout if self._direct is not None else None

    def read_page(self, read: PageRead, limit: int) -> Page | None:
        """The page a :meth:`begin_page` read brought (its future done, not cancelled);
        None when it holds members written before members carried their ``SessionInfo``
        (:meth:`page` reads those). Raises the store's error when the read failed."""
        connection, future = read
        try:
            reply = connection.result(future)
        except StoreError:
            raise
        except RedisError as exc:  # a port's method, though not a coroutine: translated here
            raise store_error(exc) from exc
        return page_of(reply, limit)

    async def _read(self, *command: Any) -> Any:
        return await self._calls.call(*command)

    async def _bare_page(self, tenant: str, members: list[bytes], limit: int) -> Page:
        """A page where some members are bare positions (a cwd's listing): those come from
        the rows (:func:`rows_command`, :func:`page_with_rows`)."""
        split, command = rows_command(tenant, members, limit)
        return page_with_rows(split, await self._read(*command), len(members) > limit)

    def close(self) -> None:
        """Close the connection pages are read on, if one was opened (the next page opens
        it again)."""
        if self._direct is not None:
            self._direct.close()

    async def row(self, tenant: str, session_id: str) -> JsonObject | None:
        raw = await self.redis.hget(TenantKeys(tenant).rows, session_id)
        return decode_row(raw) if raw else None

    async def dump(self, tenant: str) -> IndexDump:
        """Everything the index holds for a tenant (to compare a rebuild with the live one)."""
        keys = TenantKeys(tenant)
        rows = await self.redis.hgetall(keys.rows)
        versions = await self.redis.hgetall(keys.versions)
        listings: dict[str, list[str]] = {}
        for version in versions.values():
            for name in Version.decode(version).entries:  # type: ignore[union-attr]
                listings[name] = await self.redis.zrange(keys.index(name), 0, -1)
        return IndexDump(rows=rows, listings=listings)
