"""Where the broker extends redis-py, in one place: commands packed by hiredis, connections
and cluster clients that send nothing while a gate is closed, a cluster client that reads
a stream read's keys from its arguments, and a Sentinel pool that follows a switch of
master at once.

Every extension goes through what redis-py offers for it: a connection class of our own
(``pack_command``, ``send_packed_command`` and ``connect_check_health`` overridden), a
connection pool class of our own (``get_connection``, ``get_master_address``), a cluster
client subclass (``execute_command``, ``initialize``, ``pipeline``), its
``connection_kwargs``, its nodes' ``connection_class`` and its ``commands_parser``; and the
pools' public ``disconnect``. No private attribute is read or written, and no frame is
inspected. ``tests/test_compat_redis.py`` checks what each extension assumes by
behaviour (real servers, a real cluster), at the lowest and the highest redis-py the pin
allows (``.ci/compat``).

:func:`packed_by_hiredis` packs with ``redis.connection.HiredisRespSerializer`` (redis-py's
synchronous client's packer): the bytes redis-py's own packer makes, in C.

:func:`gated` mixes in another override of ``pack_command``, which asks a :class:`Gate`
first (the store's breaker, :mod:`broker.store.breaker`); :class:`GatedCluster` asks it
before redis-py's cluster machinery runs, and installs the gated connection class in the
cluster's node factory; :class:`GatedPool` asks it before a command waits for a connection,
and a cluster's :class:`ReleasedOpening` connections while they open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeGuard, TypeVar

from redis.asyncio import BlockingConnectionPool, RedisCluster
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import AbstractBackoff
from redis.connection import DefaultParser, HiredisRespSerializer
from redis.exceptions import MovedError, RedisClusterException, RedisError


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


def error_from_reply(text: str) -> RedisError:
    """The exception redis-py's client raises for the error reply ``text`` (``READONLY …``
    as ``ReadOnlyError``, ``NOSCRIPT …`` as ``NoScriptError``, ``OOM …`` as
    ``OutOfMemoryError``, an unknown code as ``ResponseError`` with the whole text): its
    parsers' own mapping (``parse_error`` of ``redis.connection.DefaultParser``, the parser
    class its connections take by default), so that a reply read on the broker's own connections
    fails as the same reply through the client does."""
    error: RedisError = DefaultParser.parse_error(text)
    return error


class PausesBackoff(AbstractBackoff):
    """redis-py's retry pausing as ``pause(failures)`` says (the code base's one retry
    helper's, ``broker.retry.doubling_pause``), through redis-py's public
    ``AbstractBackoff``."""

    def __init__(self, pause: Callable[[int], float]) -> None:
        self.pause = pause

    def compute(self, failures: int) -> float:
        return self.pause(failures)

    def reset(self) -> None:
        """Nothing to forget: each pause follows from the count of failures alone."""


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


class PoolGate(Gate, Protocol):
    """What a :class:`GatedPool` (and a cluster's :class:`ReleasedOpening` connections) ask
    before they hand out a connection."""

    def unless_away(self, waiting: Awaitable[T]) -> Awaitable[T]:
        """``waiting`` awaited, unless the gate closes meanwhile: then it is given up
        (cancelled) and the gate's error raised."""
        ...


class ReleasedOpening(GatedConnection):
    """A gated connection whose opening (the socket's connect and the handshake) is given
    up as soon as its gate closes, with the gate's error (:meth:`PoolGate.unless_away`):
    what a :class:`GatedPool` does for the connections it hands out, for a cluster's nodes,
    which open one per command past their free ones instead of waiting for a pool. When a
    server stalls, a connection's handshake hangs up to the connect timeout; a command
    opening one as the gate closes fails then at once, as one sent afterwards does. A
    connection given up half-open is closed (its handshake's reply must never be read as a
    command's). Leans on redis-py opening every connection with ``connect_check_health``
    (``connect`` calls it, and ``send_packed_command`` on a connection not open yet);
    ``tests/test_compat_redis.py`` checks it by behaviour."""

    gate: PoolGate

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self.is_connected:
            return
        opening = super().connect_check_health(check_health, retry_socket_connect)
        try:
            await self.gate.unless_away(opening)
        except BaseException:
            await self.disconnect(nowait=True)
            raise


def releases_opening(gate: Gate) -> TypeGuard[PoolGate]:
    """Whether ``gate`` is a :class:`PoolGate`, found on its class alone. (Not
    ``isinstance`` with a runtime-checkable protocol: on Python 3.11 that reads each of the
    protocol's members on the gate, in an order that varies from run to run, ``away``
    included, which may be a property whose every read counts.)"""
    return callable(getattr(type(gate), "unless_away", None))


def gated(connection_class: type[AbstractConnection], gate: Gate) -> type[AbstractConnection]:
    """``connection_class`` behind ``gate`` (a class of its own for each client)."""
    name = f"Gated{connection_class.__name__}"
    return type(name, (GatedConnection, connection_class), {"gate": gate})


def gated_opening(
    connection_class: type[AbstractConnection], gate: PoolGate
) -> type[AbstractConnection]:
    """``connection_class`` behind ``gate``, its opening given up when the gate closes
    (:class:`ReleasedOpening`)."""
    name = f"Gated{connection_class.__name__}"
    return type(name, (ReleasedOpening, connection_class), {"gate": gate})


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


class GatedCluster(RedisCluster):
    """A cluster client whose commands, pipelines and slot-map reloads are refused at once
    while its :attr:`gate` says so, before redis-py's own handling sees anything: a refusal
    that reached it from a node's connection would count as that node failing (its free
    connections cut, the slot map reloaded through the same closed gate, a pipeline tried
    again three times, a quarter of a second apart). :meth:`install_gate` also gates every
    connection to every node (pub/sub, and what redis-py sends on its own, included); with a
    :class:`PoolGate` (the store's breaker), a connection being opened is given up when the
    gate closes (:class:`ReleasedOpening`)."""

    gate: Gate | None = None

    def install_gate(self, gate: Gate) -> None:
        """Put this client and every connection it will open behind ``gate``. Call it
        before the client's first command. Leans on redis-py building every ``ClusterNode``
        (those found later included) from the client's own ``connection_kwargs``, the one
        dict its ``NodesManager`` holds too, and on the nodes it made already (the startup
        nodes) keeping a ``connection_class`` they open connections of."""
        kwargs = self.connection_kwargs
        plain = kwargs["connection_class"]
        kind = gated_opening(plain, gate) if releases_opening(gate) else gated(plain, gate)
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
    name the old one), every connection of the pool is closed (redis-py's
    ``disconnect``, those in use included: their command fails as a lost connection and
    is sent again to the new master, and a subscriber subscribes again there), and a
    connection still open elsewhere (one being opened to the old master at the switch)
    reconnects before it sends anything (:class:`FollowingSentinelConnection`).

    While the Sentinels promote a replica (:meth:`hold`, until :meth:`follow` names the
    new master) the pool hands out no connection: a write the old master acknowledged
    after the promotion would be dropped by its resync, so commands fail at once instead
    with ``MasterNotFoundError`` (the store failing over: "try again").

    Leans on every command, pipeline and subscriber taking its connection with
    ``get_connection``, a connection to the master asking ``get_master_address`` when it
    connects, and the client closing its pool with ``aclose``;
    ``tests/test_compat_redis.py`` checks them."""

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

    async def follow(self, address: _SentinelAddress) -> bool:
        """Send everything to the master at ``address`` from now on; whether that is
        another server than the one the pool used (then every connection of the pool was
        closed, see the class)."""
        if address != self.followed:
            self.held_until = 0.0  # the failover is over
        before = self.followed or self.master_address
        self.followed = self.master_address = address
        if before is None or before == address:
            return False
        await self.disconnect(inuse_connections=True)
        return True

    async def aclose(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
        await super().aclose()


class FollowingSentinelConnection(SentinelManagedConnection):
    """redis-py's connection to a Sentinel master that goes to the master its pool
    follows (:attr:`BlockingSentinelPool.followed`). redis-py asks the Sentinels only in
    ``connect()``, which the pool calls when it hands a connection out; a command sent
    again on a connection that failed under it (the client's retry, after a lost
    connection or a ``READONLY`` reply) reconnects through ``connect_check_health`` to the
    server it had, the old master: here to the followed one. And a connection still open
    to another server (opened to the old master while the pool switched) is closed before
    it sends a command, which then goes to the followed master.
    ``tests/test_compat_redis.py`` checks both paths."""

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        followed = getattr(self.connection_pool, "followed", None)
        if followed is not None and not self.is_connected:
            self.host, self.port = followed
        await super().connect_check_health(check_health, retry_socket_connect)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        followed = getattr(self.connection_pool, "followed", None)
        if followed is not None and (self.host, self.port) != followed and self.is_connected:
            await self.disconnect()  # reconnected below, to the followed master
        await super().send_packed_command(command, check_health)


class FollowingSentinelSSLConnection(FollowingSentinelConnection, SentinelManagedSSLConnection):
    """:class:`FollowingSentinelConnection` over TLS."""


# -- stream reads' slots, found without asking the server -------------------------------------


class StreamKeysCluster(GatedCluster):
    """A (gated) cluster client that finds the keys of an ``XREAD`` or ``XREADGROUP`` from
    its own arguments. redis-py asks the server (``COMMAND GETKEYS``) for the keys of every
    command flagged ``movablekeys``, these two included, before sending it, twice for a
    command in a pipeline: a projector polling 256 change feeds sent two ``COMMAND
    GETKEYS`` for each read, most of an idle broker's commands. Leans on redis-py asking
    its ``commands_parser``'s ``get_keys(command, *args)`` for such a command's keys,
    pipelines included; ``tests/test_compat_redis.py`` counts the questions a real
    cluster gets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands_parser = stream_keys_parser(self.commands_parser)


class _StreamKeys:
    """Mixed into a cluster client's commands parser: :func:`stream_read_keys` first."""

    async def get_keys(self, *args: Any) -> Any:
        keys = stream_read_keys(args[0], args[1:]) if args else None
        if keys is not None:
            return keys
        return await super().get_keys(*args)  # type: ignore[misc]  # the parser's own


def stream_keys_parser(parser: Any) -> Any:
    """A commands parser of ``parser``'s class that reads a stream read's keys from its
    arguments (the same state: a new one, uninitialised, as the client makes it)."""
    kind = type(parser)
    return type(f"StreamKeys{kind.__name__}", (_StreamKeys, kind), {})()


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
