"""redis-py's internals the broker relies on, in one place: commands packed by hiredis,
connections and cluster clients that send nothing while a gate is closed, a cluster client
that reloads its slot map without cutting the connections in use, and a Sentinel pool that
follows a switch of master at once.

:func:`packed_by_hiredis` mixes into a pool's ``connection_class`` an override of
``AbstractConnection.pack_command`` (redis-py's asyncio connections pack in Python) using
``redis.connection.HiredisRespSerializer`` (redis-py's synchronous client's packer); both
are redis-py internals. ``tests/test_compat_redis.py`` checks that the override packs the
bytes redis-py's own packer makes, so an upgrade that changes either fails there by name.

:func:`gated` mixes in another override of ``pack_command``, which asks a :class:`Gate`
first (the store's breaker, :mod:`broker.store.breaker`); :class:`GatedCluster` asks it
before redis-py's cluster machinery runs, and installs the gated connection class in the
cluster's node factory; :class:`GatedPool` asks it before a command waits for a connection.
``tests/test_compat_redis.py`` checks what each assumes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from redis.asyncio import BlockingConnectionPool, RedisCluster
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.connection import HiredisRespSerializer
from redis.exceptions import MovedError, RedisClusterException


class _HiredisPacking(AbstractConnection):
    """Commands packed by hiredis, in C, as redis-py's synchronous client packs them
    (``HiredisRespSerializer``, the same bytes); its asyncio client packs them in Python,
    which was 45% of an agent host's time appending events (cProfile of ``append_many``)."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)


_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def packed_by_hiredis(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` with its commands packed by hiredis."""
    if issubclass(connection_class, _HiredisPacking):
        return connection_class
    if connection_class not in _PACKED:
        name = f"Hiredis{connection_class.__name__}"
        _PACKED[connection_class] = type(name, (_HiredisPacking, connection_class), {})
    return _PACKED[connection_class]


T = TypeVar("T")


class Gate(Protocol):
    """What a gated connection or cluster client asks before it sends a command."""

    away: bool
    """False: every command passes (all a command costs while the store answers)."""

    def check(self) -> None:
        """Asked while :attr:`away`: raise the error a refused command fails with, or
        return to let this one pass (a probe's own command)."""
        ...


class GatedConnection(AbstractConnection):
    """A connection that sends nothing its class's :attr:`gate` refuses. It leans on
    redis-py's asyncio connections packing every command with ``pack_command`` before
    writing any of it, a pipeline's with ``pack_commands``, which packs each command with
    ``pack_command``: a refused command has written nothing."""

    gate: Gate

    def pack_command(self, *args: Any) -> Any:
        gate = self.gate
        if gate.away:
            gate.check()
        return super().pack_command(*args)


def gated(connection_class: type[AbstractConnection], gate: Gate) -> type[AbstractConnection]:
    """``connection_class`` behind ``gate`` (a class of its own for each client)."""
    name = f"Gated{connection_class.__name__}"
    return type(name, (GatedConnection, connection_class), {"gate": gate})


class ReloadingCluster(RedisCluster):
    """A cluster client whose ``aclose()``, when redis-py itself calls it to reload the slot
    map (a command's or a pipeline's CLUSTERDOWN, a lost connection in a pipeline), only has
    the map reloaded before the next command: redis-py's own close cuts every connection of
    every node, those other commands and the pub/sub readers use at that moment included
    (``AttributeError: 'NoneType' object has no attribute 'writelines'`` on a connection
    closed under a write). A close the broker asks for (stopping) closes. redis-py 8.2
    and later reload in place and close the client nowhere: there the override has
    nothing to catch. Leans on redis-py's ``_initialize`` flag and on the names of the
    functions that call ``aclose`` for a reload (:data:`RELOADERS`);
    ``tests/test_compat_redis.py`` checks both."""

    async def aclose(self) -> None:
        if _called_by_redis_py_for_a_reload():
            self._initialize = True  # the client's own flag: reload the map, then go on
            return
        await super().aclose()


RELOADERS = frozenset({"_execute_command", "execute"})
"""redis-py's cluster functions that call ``aclose()`` to reload the slot map (a command's,
a pipeline's)."""


def _called_by_redis_py_for_a_reload() -> bool:
    caller = sys._getframe(2)  # 0: this function, 1: aclose, 2: whoever called aclose
    return caller.f_code.co_name in RELOADERS and caller.f_globals.get("__name__") == (
        RedisCluster.__module__
    )


async def follow_redirect(redis: RedisCluster, exc: BaseException) -> bool:
    """When ``exc`` is a MOVED that reached a pub/sub reader, patch the slot map of
    ``redis`` with the node it names (as the client does for its own commands), so that its
    pub/sub moves the slot's subscriptions there; whether it was one. (A slot being migrated
    serves its shard channels from its old node until it has moved: no ASK for them.)"""
    if not isinstance(exc, MovedError):
        return False
    # ``nodes_manager`` holds the client's slot map; ``move_slot`` is what the client itself
    # calls on a MOVED, and it notifies the pub/sub objects.
    await redis.nodes_manager.move_slot(exc)
    return True


class GatedCluster(ReloadingCluster):
    """A cluster client whose commands, pipelines and slot-map reloads are refused at once
    while its :attr:`gate` says so, before redis-py's own handling sees anything: a refusal
    that reached it from a node's connection would count as that node failing (its free
    connections cut, the slot map reloaded through the same closed gate, a pipeline tried
    again three times, a quarter of a second apart). :meth:`install_gate` also gates every
    connection to every node (pub/sub, and what redis-py sends on its own, included)."""

    gate: Gate | None = None

    def install_gate(self, gate: Gate) -> None:
        """Put this client and every connection it will open behind ``gate``. Call it
        before the client's first command. Leans on redis-py building every ``ClusterNode``
        (those found later included) from the client's own ``connection_kwargs``, the one
        dict its ``NodesManager`` holds too, and on the nodes it made already (the startup
        nodes) keeping a ``connection_class`` they open connections of."""
        kwargs = self.connection_kwargs
        kind = gated(kwargs["connection_class"], gate)
        kwargs["connection_class"] = kind
        for node in [*self.nodes_manager.startup_nodes.values(), *self.get_nodes()]:
            node.connection_class = kind  # type: ignore[assignment]  # typed as Connection
        self.gate = gate

    def check_gate(self) -> None:
        """Raise the gate's error if it refuses a command now."""
        gate = self.gate
        if gate is not None and gate.away:
            gate.check()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.check_gate()
        return await super().execute_command(*args, **kwargs)

    async def initialize(self, *args: Any, **kwargs: Any) -> RedisCluster:
        # redis-py reloads its map here before trying a failed command again: a command
        # already in flight when the gate closed fails then, with the gate's error (also
        # when it closed during the reload, which then found no node to ask).
        self.check_gate()
        try:
            return await super().initialize(*args, **kwargs)
        except RedisClusterException:
            self.check_gate()
            raise

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        if shard_hint:  # as redis-py's own pipeline(), which makes the same pipeline
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        # mypy reads an attribute redis-py's own ClusterPipeline sets as abstract
        return GatedClusterPipeline(self, transaction)  # type: ignore[abstract]


class GatedClusterPipeline(ClusterPipeline):
    """A :class:`GatedCluster`'s pipeline: refused at once while the client's gate says
    so (its commands are sent by ``execute`` alone)."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        client = self.cluster_client
        if isinstance(client, GatedCluster):
            try:
                client.check_gate()
            except BaseException:
                await self.reset()  # as redis-py's own execute leaves it
                raise
        return await super().execute(raise_on_error, allow_redirections)


# --- Sentinel: a pool that waits for a free connection and follows a switch of master ---
#
# Self-contained: what the rest of this module holds is not used here, nor the other way.

_SentinelAddress = tuple[str, int]


class MasterFollower(Protocol):
    """What tells a :class:`BlockingSentinelPool` where the master is now (the store's
    ``broker.store.sentinel_follow.SwitchFollower``): started with the pool's first
    connection, stopped when the pool closes (``aclose``, which its client's own
    ``aclose`` calls)."""

    def start(self, pool: BlockingSentinelPool) -> None: ...

    async def stop(self) -> None: ...


class PoolGate(Gate, Protocol):
    """What a :class:`GatedPool` asks before it hands out a connection."""

    def unless_away(self, waiting: Awaitable[T]) -> Awaitable[T]:
        """``waiting`` awaited, unless the gate closes meanwhile: then it is given up
        (cancelled) and the gate's error raised."""
        ...


class GatedPool(BlockingConnectionPool):
    """redis-py's blocking pool behind :attr:`gate` (None: redis-py's own behaviour).

    A command waits for a free connection (up to the pool's ``timeout``), and for one being
    opened (up to the connect timeout). When the server stalls, the commands in flight hold
    every connection until their reply timeout, a new connection's handshake hangs too, and
    every further command queues behind them: a :class:`GatedConnection` refuses a command
    only once it holds a connection, so under load a request waited for the pool for up to
    its whole timeout though the store was long known away. This pool asks its gate before
    it waits: while away, the command fails at once; and a command already waiting is
    released with the gate's error as soon as the gate closes
    (:meth:`PoolGate.unless_away`). Leans on every command, pipeline and subscriber taking
    its connection with the pool's ``get_connection``, and on a cancelled
    ``get_connection`` giving back what it took; ``tests/test_compat_redis_pool.py`` checks
    both by behaviour."""

    gate: PoolGate | None = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        gate = self.gate
        if gate is None:
            return await super().get_connection(*args, **kwargs)
        if gate.away:
            gate.check()
        return await gate.unless_away(super().get_connection(*args, **kwargs))


class BlockingSentinelPool(SentinelConnectionPool, GatedPool):
    """redis-py's Sentinel pool that, as the standalone client's, waits for a free
    connection (up to its ``timeout``) instead of failing with "Too many connections", and
    that follows a switch of master at once (:meth:`follow`).

    redis-py's pool asks the Sentinels for the master only when it opens a connection: the
    connections it holds keep talking to the old master after a failover until that server
    answers ``READONLY``, which a ``SENTINEL FAILOVER``'s old master does only once the
    Sentinels reconfigure it, 10-20 s later. Meanwhile it takes writes that its
    resync as a replica drops (a lease renewed there, appends, a pub/sub subscriber that
    hears nothing of the new master's). Once :meth:`follow` names the new master, new
    connections go there without asking the Sentinels again (one lagging Sentinel would
    name the old one), and every connection to another server is closed: idle ones at
    once, and those in use by aborting their socket, so that their command fails as a
    lost connection and is sent again to the new master, and a subscriber subscribes
    again there.

    While the Sentinels promote a replica (:meth:`hold`, until :meth:`follow` names the
    new master) the pool hands out no connection: a write the old master acknowledged
    after the promotion would be dropped by its resync, so commands fail at once instead
    with ``MasterNotFoundError`` (the store failing over: "try again").

    Leans on redis-py's ``_available_connections`` and ``_in_use_connections`` (the pool's
    connections), a connection's ``_writer`` (its asyncio stream), every command, pipeline
    and subscriber taking its connection with ``get_connection``, and the client closing
    its pool with ``aclose``; ``tests/test_compat_redis.py`` checks them."""

    follower: MasterFollower | None = None
    """Started with the first connection (set by whoever makes the pool)."""
    followed: _SentinelAddress | None = None
    """The master :meth:`follow` named last; None until it has."""
    held_until = 0.0
    """Until when (the event loop's clock) no connection is handed out (:meth:`hold`)."""

    def hold(self, seconds: float) -> None:
        """Hand out no connection for ``seconds`` (a failover is under way), or until
        :meth:`follow` names another master; ``0``: hand them out again."""
        self.held_until = asyncio.get_running_loop().time() + seconds if seconds else 0.0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self.held_until and asyncio.get_running_loop().time() < self.held_until:
            raise MasterNotFoundError(
                f"the Sentinels are failing {self.service_name} over: no command "
                "until its new master is known"
            )
        return await super().get_connection(*args, **kwargs)

    async def get_master_address(self) -> _SentinelAddress:
        if self.follower is not None:
            self.follower.start(self)
        if self.followed is not None:
            return self.followed
        address: _SentinelAddress = await super().get_master_address()
        return address

    async def follow(self, address: _SentinelAddress) -> int:
        """Send everything to the master at ``address`` from now on; closes every
        connection to another server (idle, or in use: see the class) and returns how
        many it closed. Called again with the same address, closes those that were
        being opened to the old master at the switch."""
        if address != self.followed:
            self.held_until = 0.0  # the failover is over
        self.followed = self.master_address = address
        idle = [c for c in self._available_connections if _elsewhere(c, address)]
        used = [c for c in self._in_use_connections if _elsewhere(c, address)]
        for connection in used:
            # Its user then reads a lost connection, closes it and connects again.
            connection._writer.transport.abort()  # type: ignore[union-attr]
        await asyncio.gather(*(c.disconnect() for c in idle), return_exceptions=True)
        return len(idle) + len(used)

    async def aclose(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
        await super().aclose()


class FollowingSentinelConnection(SentinelManagedConnection):
    """redis-py's connection to a Sentinel master that reconnects to the master its pool
    follows (:attr:`BlockingSentinelPool.followed`). redis-py asks the Sentinels only in
    ``connect()``, which the pool calls when it hands a connection out; a command sent
    again on a connection that failed under it (the client's retry, after a lost
    connection or a ``READONLY`` reply) reconnects through ``connect_check_health`` to the
    server it had, the old master. ``tests/test_compat_redis.py`` checks that path."""

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        followed = getattr(self.connection_pool, "followed", None)
        if followed is not None and not self.is_connected:
            self.host, self.port = followed
        await super().connect_check_health(check_health, retry_socket_connect)


class FollowingSentinelSSLConnection(FollowingSentinelConnection, SentinelManagedSSLConnection):
    """:class:`FollowingSentinelConnection` over TLS."""


def _elsewhere(connection: AbstractConnection, address: _SentinelAddress) -> bool:
    """Whether ``connection`` is open (and not being closed) to a server other than
    ``address``."""
    at = (getattr(connection, "host", None), getattr(connection, "port", None))
    writer = getattr(connection, "_writer", None)
    return at != address and writer is not None and not writer.transport.is_closing()


# -- stream reads' slots, found without asking the server -------------------------------------


class StreamKeysCluster(GatedCluster):
    """A (gated) cluster client that finds the slot of an ``XREAD`` or ``XREADGROUP`` from
    its own arguments. redis-py asks the server (``COMMAND GETKEYS``) for the keys of every command
    flagged ``movablekeys``, these two included, before sending it, twice for a command in
    a pipeline: a projector polling 256 change feeds sent two ``COMMAND GETKEYS`` for each
    read, most of an idle broker's commands. Leans on redis-py finding every command's slot
    with ``_determine_slot(command, *args)``, pipelines included;
    ``tests/test_compat_redis.py`` checks it."""

    async def _determine_slot(self, command: str, *args: Any) -> int:
        keys = stream_read_keys(command, args)
        if keys is None:
            return await super()._determine_slot(command, *args)
        slots = {self.keyslot(key) for key in keys}
        if len(slots) != 1:  # as redis-py's own message
            raise RedisClusterException(f"{command} - all keys must map to the same key slot")
        return slots.pop()


_READ_OPTIONS = {b"COUNT": 1, b"BLOCK": 1, b"NOACK": 0, b"GROUP": 2}
"""The options of ``XREAD``/``XREADGROUP`` before ``STREAMS``, and how many values each
takes (``GROUP group consumer``)."""


def stream_read_keys(command: Any, args: tuple[Any, ...]) -> list[Any] | None:
    """The stream keys of an ``XREAD`` or ``XREADGROUP`` (``command`` and its ``args``
    as redis-py passes them), read as Redis reads them; None: not one of those, or not
    understood here (redis-py asks the server then)."""
    name = _upper(command)
    if name not in (b"XREAD", b"XREADGROUP"):
        return None
    i = 0
    while i < len(args):
        word = _upper(args[i])
        if word == b"STREAMS":
            rest = args[i + 1 :]
            if not rest or len(rest) % 2:
                return None
            return list(rest[: len(rest) // 2])
        if word not in _READ_OPTIONS:
            return None
        i += 1 + _READ_OPTIONS[word]
    return None


def _upper(word: Any) -> bytes | None:
    if isinstance(word, str):
        return word.upper().encode()
    if isinstance(word, bytes):
        return word.upper()
    return None
