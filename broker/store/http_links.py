"""Streamable HTTP connections in the store: what any front needs to serve any request of one.

ACP's Streamable HTTP transport splits a connection over many HTTP requests (``POST`` a
message, ``GET`` a stream, ``DELETE`` the end), and a load balancer may send each to a
different front. So a connection lives here, under one hash tag (every key of it in one
slot: its scripts stay legal on a cluster):

- its *record* (a hash): the tenant and credential subject it was opened by, what
  ``initialize`` negotiated, the sessions active on it and how far each one's events were
  sent, and a counter and the current reader per scope; it expires after the idle setting;
- its *holder* (a string with a lease): the front that runs the connection now (its
  requests in flight, its sessions' subscriptions); another takes over once the lease lapses;
- its *inbox* (a stream): the messages POSTed to it, in arrival order, which the holder takes;
- one *outbox stream per scope* (the connection itself, and each session): what it sends the
  client, each message at the next integer cursor of its scope (the entry ID ``<n>-0``, the
  SSE event id), the last :attr:`HttpLinks.retention` kept, so that a GET on any front reads
  from any cursor still kept.

Scopes are named ``c`` (the connection) and ``s:<sessionId>``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .appends import lua_script
from .boundary import port
from .client import Store, commands
from .keys import PREFIX, node_channel
from .scripts import call_each

CONNECTION_SCOPE = "c"
"""The scope of what is not about one session (the connection-scoped stream)."""


def session_scope(session_id: str) -> str:
    """The scope of one session's stream on a connection."""
    return "s:" + session_id


def _emitted(reply: Any) -> list[tuple[int, str]] | None:
    """The cursors and readers an emit script answered (None: not this node's)."""
    if reply is None:
        return None
    return [(int(reply[i]), str(reply[i + 1])) for i in range(0, len(reply), 2)]


class LinkKeys:
    """The keys of one Streamable HTTP connection."""

    __slots__ = ("base", "holder", "inbox", "record")

    def __init__(self, conn_id: str) -> None:
        self.base = f"{PREFIX}:http:{{h.{conn_id}}}"
        self.record = self.base + ":conn"
        self.holder = self.base + ":holder"
        self.inbox = self.base + ":in"

    def out(self, scope: str) -> str:
        """The outbox stream of ``scope``."""
        return f"{self.base}:out:{scope}"


_DELETE = """
local record = KEYS[1]
local fields = redis.call('HKEYS', record)
for _, name in ipairs(fields) do
  if string.sub(name, 1, 2) == 'n:' then
    redis.call('DEL', ARGV[1] .. ':out:' .. string.sub(name, 3))
  end
end
return redis.call('DEL', record, KEYS[2], KEYS[3])
"""

_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""


@port
class HttpLinks:
    """The store port of Streamable HTTP connections (see the module's description).

    ``retention``: messages kept per scope's stream; ``idle_ms``: how long a connection
    nobody uses is kept; ``lease_ms``: how long a holder that stopped renewing keeps it.
    """

    def __init__(self, redis: Store, *, retention: int, idle_ms: int, lease_ms: int) -> None:
        self.redis = commands(redis)
        self.retention = retention
        self.idle_ms = idle_ms
        self.lease_ms = lease_ms
        self._emit = self.redis.register_script(lua_script("http_emit.lua"))
        self._delete = self.redis.register_script(_DELETE)
        self._renew = self.redis.register_script(_RENEW)

    # -- the record -------------------------------------------------------------------------

    async def create(self, conn_id: str, fields: dict[str, str]) -> None:
        """Record a new connection."""
        keys = LinkKeys(conn_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.record, mapping=fields)
            pipe.pexpire(keys.record, self.idle_ms)
            await pipe.execute()

    async def load(self, conn_id: str) -> dict[str, str] | None:
        """The connection's record; None when there is no such connection (or it expired)."""
        record: dict[str, str] = await self.redis.hgetall(LinkKeys(conn_id).record)
        return record or None

    async def save(self, conn_id: str, fields: dict[str, str]) -> None:
        """Set fields of an existing connection's record (nothing when it is gone)."""
        keys = LinkKeys(conn_id)
        if await self.redis.exists(keys.record):
            await self.redis.hset(keys.record, mapping=fields)

    async def next_generation(self, conn_id: str) -> int:
        """Count one more physical connection (generation) of the connection: its number."""
        return int(await self.redis.hincrby(LinkKeys(conn_id).record, "g", 1))

    async def touch(self, conn_id: str) -> bool:
        """The connection was used: its idle time starts again. False: it is gone."""
        return bool(await self.redis.pexpire(LinkKeys(conn_id).record, self.idle_ms))

    async def delete(self, conn_id: str) -> bool:
        """End the connection: every key of it goes. False: there was none."""
        keys = LinkKeys(conn_id)
        deleted = await self._delete(keys=[keys.record, keys.holder, keys.inbox], args=[keys.base])
        return bool(deleted)

    # -- the holder -------------------------------------------------------------------------

    async def claim(self, conn_id: str, node: str) -> str | None:
        """The node that holds the connection after this call: ``node`` when it was free
        (now taken for :attr:`lease_ms`), else its holder (None: it lapsed meanwhile)."""
        key = LinkKeys(conn_id).holder
        if await self.redis.set(key, node, nx=True, px=self.lease_ms):
            return node
        holder: str | None = await self.redis.get(key)
        return holder

    async def renew(self, conn_id: str, node: str) -> bool:
        """Keep holding the connection; False when ``node`` no longer holds it, or the
        connection is gone (the node lets it go)."""
        keys = LinkKeys(conn_id)
        return bool(await self._renew(keys=[keys.holder, keys.record], args=[node, self.lease_ms]))

    async def release(self, conn_id: str, node: str) -> None:
        """Let the connection go (when ``node`` holds it): the next request's front takes it."""
        keys = LinkKeys(conn_id)
        if await self.redis.get(keys.holder) == node:
            await self.redis.delete(keys.holder)

    # -- the inbox --------------------------------------------------------------------------

    async def push(self, conn_id: str, text: str, sender: str) -> str:
        """Queue a message POSTed to the connection, with who sent it (``sender``: its
        credential, as the caller writes it); its inbox entry ID."""
        keys = LinkKeys(conn_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            entry = {"m": text, "p": sender}
            pipe.xadd(keys.inbox, entry, maxlen=self.retention, approximate=True)
            pipe.pexpire(keys.inbox, self.idle_ms)
            entry_id, _ = await pipe.execute()
        return str(entry_id)

    async def inbox(self, conn_id: str, after: str) -> list[tuple[str, str, str]]:
        """The messages queued after entry ``after`` ("0": all), in order: (entry ID,
        text, sender) each."""
        rows = await self.redis.xrange(LinkKeys(conn_id).inbox, f"({after}", "+", count=256)
        return [
            (str(entry_id), str(fields.get("m", "")), str(fields.get("p", "")))
            for entry_id, fields in rows
        ]

    # -- the outbox streams -----------------------------------------------------------------

    async def emit(
        self,
        conn_id: str,
        node: str,
        messages: Sequence[tuple[str, str]],
        fields: dict[str, str] | None = None,
    ) -> list[tuple[int, str]] | None:
        """Append ``messages`` ((scope, text) each) to their scopes' streams and set
        ``fields`` of the record, at once; the cursor each got and the node reading its
        scope ("" for none). None: ``node`` no longer holds the connection (nothing was
        written)."""
        stream_keys, args = self._emit_call(conn_id, node, messages, fields)
        return _emitted(await self._emit(keys=stream_keys, args=args))

    async def emit_many(
        self, calls: Sequence[tuple[str, str, Sequence[tuple[str, str]], dict[str, str] | None]]
    ) -> list[list[tuple[int, str]] | None]:
        """:meth:`emit` of each (conn_id, node, messages, fields), in as few round trips as
        the store allows (one pipeline on one server)."""
        replies = await call_each(
            self.redis, self._emit, [self._emit_call(*call) for call in calls]
        )
        return [_emitted(reply) for reply in replies]

    def _emit_call(
        self,
        conn_id: str,
        node: str,
        messages: Sequence[tuple[str, str]],
        fields: dict[str, str] | None,
    ) -> tuple[list[str], list[str | int]]:
        keys = LinkKeys(conn_id)
        args: list[str | int] = [
            node,
            self.retention,
            self.idle_ms,
            json.dumps(fields) if fields else "",
        ]
        stream_keys = [keys.record, keys.holder]
        for scope, text in messages:
            stream_keys.append(keys.out(scope))
            args += [scope, text]
        return stream_keys, args

    async def read(
        self, conn_id: str, scope: str, after: int, count: int = 256
    ) -> list[tuple[int, str]]:
        """The messages of ``scope`` after cursor ``after``, in order (``count`` at most)."""
        rows = await self.redis.xrange(
            LinkKeys(conn_id).out(scope), f"({after}-0", "+", count=count
        )
        return [(int(str(entry_id).split("-", 1)[0]), str(f.get("m", ""))) for entry_id, f in rows]

    async def first(self, conn_id: str, scope: str) -> int | None:
        """The oldest cursor ``scope`` still keeps (None: it keeps none)."""
        rows = await self.redis.xrange(LinkKeys(conn_id).out(scope), "-", "+", count=1)
        return int(str(rows[0][0]).split("-", 1)[0]) if rows else None

    async def set_reader(self, conn_id: str, scope: str, reader: str) -> None:
        """``reader`` (a node and a stream's token) is the one GET stream of ``scope`` now."""
        await self.redis.hset(LinkKeys(conn_id).record, "r:" + scope, reader)

    async def reader(self, conn_id: str, scope: str) -> tuple[str | None, int]:
        """The GET stream reading ``scope`` now (None: none, or the connection is gone), and
        the last cursor given out in it."""
        values = await self.redis.hmget(LinkKeys(conn_id).record, ["r:" + scope, "n:" + scope])
        return values[0], int(values[1] or 0)

    # -- bells ------------------------------------------------------------------------------

    async def ring(self, node: str, message: dict[str, str]) -> None:
        """Tell front ``node`` (on its channel) that a connection it serves has news: pub/sub
        may lose it, so the node also looks by itself now and then."""
        await self.redis.spublish(node_channel(node), json.dumps(message))
