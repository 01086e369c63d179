"""What broker/compat/redis.py assumes of redis-py's internals: an upgrade that changes one
fails here, by name."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis._parsers.commands import AsyncCommandsParser as CommandsParser
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio import cluster as cluster_module
from redis.asyncio.client import Pipeline, PubSub
from redis.asyncio.cluster import (
    ClusterNode,
    ClusterPipeline,
    NodesManager,
    PipelineCommand,
    RedisCluster,
)
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.compat.redis import (
    RELOADERS,
    BlockingSentinelPool,
    FollowingSentinelConnection,
    GatedCluster,
    ReloadingCluster,
    StreamKeysCluster,
    gated,
    packed_by_hiredis,
    stream_read_keys,
)

from .support.commandstats import calls_between, command_calls
from .support.redis_server import free_port, redis_server


def test_asyncio_connections_pack_commands_in_an_overridable_method() -> None:
    # The override replaces these two; pack_commands must go through pack_command.
    assert list(inspect.signature(AbstractConnection.pack_command).parameters) == ["self", "args"]
    assert "pack_command" in inspect.getsource(AbstractConnection.pack_commands)


def test_the_synchronous_clients_hiredis_packer_packs_a_command() -> None:
    packer: Any = HiredisRespSerializer()  # typed for lists; packs *args as redis-py calls it
    assert packer.pack("GET", "k") == [b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"]


ARGUMENT = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"])),
    st.binary(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
)


@given(st.lists(ARGUMENT, min_size=1, max_size=6), st.sampled_from(["SET", "CONFIG SET"]))
def test_commands_are_packed_by_hiredis_to_the_bytes_redis_py_makes(
    args: list[Any], name: str
) -> None:
    python, hiredis = Connection(), packed_by_hiredis(Connection)()
    assert b"".join(hiredis.pack_command(name, *args)) == b"".join(python.pack_command(name, *args))
    commands = [(name, *args), ("GET", "k")]
    assert b"".join(hiredis.pack_commands(commands)) == b"".join(python.pack_commands(commands))


def _closes_of_the_client() -> set[str]:
    """The functions of redis-py's cluster module that close the cluster client itself
    (``self.aclose()`` in ``RedisCluster``, a pipeline's ``cluster_client.aclose()``), but
    for those that close it on purpose (the deprecated ``close``, a context's exit)."""
    tree = ast.parse(inspect.getsource(cluster_module))
    found = set()
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        for function in ast.walk(cls):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(function):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                    continue
                owner = ast.unparse(call.func.value)
                client = (cls.name == "RedisCluster" and owner == "self") or owner.endswith(
                    "cluster_client"
                )
                if call.func.attr == "aclose" and client:
                    found.add(function.name)
    return found - {"close", "__aexit__", "_release_usage"}


def test_redis_py_closes_its_cluster_client_for_a_reload_only_where_we_expect() -> None:
    """ReloadingCluster.aclose() tells redis-py's own reload calls by their function names.
    Up to redis-py 8.1 a command's and a pipeline's reload closed the client; from 8.2 on
    redis-py reloads in place and closes it nowhere, and the override has nothing to catch."""
    assert _closes_of_the_client() <= RELOADERS
    assert {"_execute_command", "execute"} == RELOADERS


async def test_a_close_asked_by_the_broker_closes_and_one_from_redis_py_only_reloads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[RedisCluster] = []

    async def recorded(client: RedisCluster) -> None:
        closed.append(client)

    monkeypatch.setattr(RedisCluster, "aclose", recorded)
    client = ReloadingCluster(host="127.0.0.1", port=1)
    client._initialize = False  # as once initialized

    async def _execute_command() -> None:  # named as redis-py's, but not in its module
        await client.aclose()

    await _execute_command()
    assert closed == [client]  # closed for real
    # as redis-py's own reload: the same name, in its module
    ours: dict[str, Any] = {}
    exec(
        "async def _execute_command(client):\n    await client.aclose()\n",
        {"__name__": RedisCluster.__module__},
        ours,
    )
    await ours["_execute_command"](client)
    assert closed == [client]  # not closed again
    assert client._initialize  # its map reloaded before the next command


class _Refused(RedisConnectionError):
    """What the test's gate raises (a ``ConnectionError``, as the store's breaker's)."""


class _Gate:
    """A gate that refuses every command while :attr:`away`, and counts them."""

    def __init__(self) -> None:
        self.away = True
        self.refused = 0

    def check(self) -> None:
        self.refused += 1
        raise _Refused("the gate is closed")


def test_a_gated_connection_packs_nothing_while_its_gate_refuses() -> None:
    gate = _Gate()
    connection = gated(packed_by_hiredis(Connection), gate)()
    commands = [("SET", "k", "v"), ("GET", "k")]
    with pytest.raises(_Refused):
        connection.pack_command("GET", "k")
    with pytest.raises(_Refused):  # a pipeline's: each of its commands through pack_command
        connection.pack_commands(commands)
    gate.away = False
    python = Connection()
    assert connection.pack_commands(commands) == python.pack_commands(commands)
    assert gate.refused == 2


async def test_every_command_of_a_client_goes_through_the_gate_pipelines_too(
    redis_url: str,
) -> None:
    """Commands, scripts, both kinds of pipeline and pub/sub: refused without a byte
    written (nothing of a refused pipeline ran), and served once the gate lets them by."""
    gate = _Gate()
    pool = ConnectionPool.from_url(redis_url, decode_responses=True)
    pool.connection_class = gated(pool.connection_class, gate)
    client = Redis.from_pool(pool)
    gate.away = False
    assert await client.ping()  # a connection made while open, kept in the pool
    gate.away = True
    try:
        with pytest.raises(_Refused):
            await client.set("k", "v")
        with pytest.raises(_Refused):
            await client.eval("return redis.call('SET', KEYS[1], 'v')", 1, "k")
        for transaction in (False, True):
            async with client.pipeline(transaction=transaction) as pipe:
                pipe.set("k", "v")
                pipe.incr("n")
                with pytest.raises(_Refused):
                    await pipe.execute()
        pubsub = client.pubsub()
        with pytest.raises(_Refused):
            await pubsub.subscribe("channel")
        await pubsub.aclose()
        refused = gate.refused
        gate.away = False
        assert await client.mget("k", "n") == [None, None]  # nothing of them ran
        async with client.pipeline(transaction=True) as pipe:
            pipe.set("k", "v")
            pipe.incr("n")
            assert await pipe.execute() == [True, 1]
        assert refused >= 5  # one each (more if redis-py tried one again)
    finally:
        await client.aclose()


async def test_a_gated_clusters_nodes_found_later_open_gated_connections(
    redis_url: str,
) -> None:
    """``install_gate`` leans on redis-py building every node from the client's own
    ``connection_kwargs`` (the NodesManager's too), and each node opening connections of
    its ``connection_class``, for its commands and its share of a pipeline alike."""
    gate = _Gate()
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    client = GatedCluster(host="127.0.0.1", port=port, decode_responses=True)
    client.install_gate(gate)
    assert client.nodes_manager.connection_kwargs is client.connection_kwargs
    for found_later in (NodesManager.initialize, NodesManager.move_slot):
        assert "**self.connection_kwargs" in inspect.getsource(found_later)
    later = ClusterNode("127.0.0.1", port, **client.connection_kwargs)
    try:
        for node in [*client.nodes_manager.startup_nodes.values(), later]:
            gate.away = True
            with pytest.raises(_Refused):
                await node.execute_command("SET", "k", "v")
            with pytest.raises(_Refused):
                await node.execute_pipeline([PipelineCommand(0, "SET", "k", "v")])
            gate.away = False
            assert await node.execute_command("GET", "k") is None
    finally:
        await later.disconnect()
        await client.aclose()


async def test_a_gated_cluster_refuses_commands_pipelines_and_reloads_before_redis_py() -> None:
    """Refused before redis-py's cluster machinery runs (no connection is tried: the port
    is free); its pipeline is the one redis-py's ``pipeline()`` would make."""
    assert list(inspect.signature(RedisCluster.pipeline).parameters) == [
        "self",
        "transaction",
        "shard_hint",
    ]
    assert "ClusterPipeline(self, transaction)" in inspect.getsource(RedisCluster.pipeline)
    gate = _Gate()
    client = GatedCluster(host="127.0.0.1", port=free_port())
    client.install_gate(gate)
    try:
        with pytest.raises(_Refused):
            await client.get("k")
        with pytest.raises(_Refused):
            await client.initialize()
        pipe = client.pipeline()
        assert isinstance(pipe, ClusterPipeline)
        pipe.set("k", "v")
        with pytest.raises(_Refused):
            await pipe.execute()
        assert len(pipe) == 0  # reset, as redis-py's execute leaves it
        assert gate.refused == 3
    finally:
        await client.aclose()


class _ClosingGate(_Gate):
    """A gate that lets the first command by, then refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    @property
    def away(self) -> bool:
        self.asked += 1
        return self.asked > 1

    @away.setter
    def away(self, value: bool) -> None:
        pass


async def test_a_reload_the_gate_closed_under_fails_with_the_gates_error() -> None:
    """redis-py's reload asks each startup node and, when none answers, raises its own
    ``RedisClusterException`` (the node's error as its cause): once the gate closed, the
    gate's error is raised instead."""
    gate = _ClosingGate()
    client = GatedCluster(host="127.0.0.1", port=free_port())
    client.install_gate(gate)
    try:
        with pytest.raises(_Refused) as refused:
            await client.initialize()
        assert isinstance(refused.value.__context__, RedisClusterException)
        assert isinstance(refused.value.__context__.__cause__, _Refused)  # the node's
    finally:
        await client.aclose()


# --- Sentinel: BlockingSentinelPool (self-contained block) ---


def test_a_sentinel_pool_asks_its_get_master_address_and_keeps_its_connections_where_we_look() -> (
    None
):
    """BlockingSentinelPool overrides get_master_address (what a connection to the master
    asks before connecting), closes connections it finds in the pool's two collections, and
    aborts an in-use one through its stream writer; a client closes its pool with aclose."""
    assert "get_master_address()" in inspect.getsource(SentinelManagedConnection._connect_retry)
    assert "self._available_connections" in inspect.getsource(ConnectionPool.disconnect)
    assert "self._in_use_connections" in inspect.getsource(ConnectionPool.disconnect)
    assert "self._writer = None" in inspect.getsource(Connection.disconnect)
    assert "connection_pool.aclose()" in inspect.getsource(Redis.aclose)
    # Every command, pipeline and subscriber takes its connection with get_connection.
    assert "pool.get_connection()" in inspect.getsource(Redis.execute_command)
    assert "connection_pool.get_connection()" in inspect.getsource(Pipeline.execute)
    assert "connection_pool.get_connection()" in inspect.getsource(PubSub.connect)
    mro = BlockingSentinelPool.__mro__
    assert mro.index(SentinelConnectionPool) < mro.index(BlockingConnectionPool)


def test_a_command_sent_again_reconnects_without_asking_the_sentinels() -> None:
    """Why FollowingSentinelConnection overrides connect_check_health: a command's retry
    reconnects through it (not through connect(), where redis-py asks the Sentinels)."""
    assert "connect_check_health(" in inspect.getsource(Connection.send_packed_command)
    assert "connect_check_health(" in inspect.getsource(Connection.connect)
    assert "_connect_retry" not in inspect.getsource(Connection.connect_check_health)
    assert list(inspect.signature(Connection.connect_check_health).parameters) == [
        "self",
        "check_health",
        "retry_socket_connect",
    ]


class _OneMaster:
    """Stands in for redis-py's ``Sentinel``: always names ``address``."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        return self.address


async def test_a_followed_switch_moves_idle_in_use_and_new_connections_to_the_new_master() -> None:
    with redis_server() as first_url, redis_server() as second_url:
        first = ("127.0.0.1", int(first_url.rsplit(":", 1)[1].split("/")[0]))
        second = ("127.0.0.1", int(second_url.rsplit(":", 1)[1].split("/")[0]))
        pool = BlockingSentinelPool(
            "m",
            _OneMaster(first),
            connection_class=FollowingSentinelConnection,
            max_connections=8,
            timeout=5,
            decode_responses=True,
            retry=Retry(NoBackoff(), 2, (ConnectionError,)),
        )
        client = Redis.from_pool(pool)
        pubsub = client.pubsub()
        try:
            await asyncio.gather(*(client.blpop(["idle"], 0.05) for _ in range(4)))
            await pubsub.subscribe("ch")
            blocked: asyncio.Task[Any] = asyncio.ensure_future(client.blpop(["list"], 0))
            for _ in range(500):  # until the read is sent (bounded)
                if len(pool._in_use_connections) == 2:  # the subscriber's, the blocked read's
                    break
                await asyncio.sleep(0.01)
            assert len(pool._available_connections) == 2  # of the 4 the reads opened

            pool.hold(5)  # a failover under way: no connection handed out
            with pytest.raises(MasterNotFoundError):
                await client.get("k")
            assert await pool.follow(second) == 4  # 2 idle, 2 in use; the hold ends
            assert await pool.follow(second) == 0
            assert await pool.get_master_address() == second

            async with Redis(port=second[1], decode_responses=True) as direct:
                await client.set("k", "v")  # a connection the pool had: now on the second
                assert await direct.get("k") == "v"
                # The blocked read was sent again to the second server: a push there ends it.
                while not blocked.done():
                    await direct.rpush("list", "x")
                    await asyncio.sleep(0.05)
                assert tuple(await blocked) == ("list", "x")
                # The subscriber lost its connection: its next read subscribes again there.
                heard = None
                async with asyncio.timeout(10):
                    while heard is None:
                        with contextlib.suppress(ConnectionError):
                            heard = await pubsub.get_message(True, timeout=0.1)
                        await direct.publish("ch", "hi")
                assert heard["data"] == "hi"
        finally:
            await pubsub.aclose()
            await client.aclose()


# -- StreamKeysCluster ---------------------------------------------------------------------------


def test_redis_py_finds_a_commands_slot_with_determine_slot() -> None:
    """The override replaces ``_determine_slot(command, *args)``, where redis-py asks the
    server for a stream read's keys (they are movable). That a command and a pipeline both
    find their slot through it is checked on a real cluster, below."""
    params = list(inspect.signature(RedisCluster._determine_slot).parameters)
    assert params == ["self", "command", "args"]
    assert "_get_moveable_keys" in inspect.getsource(CommandsParser.get_keys)


async def test_stream_reads_ask_no_keys_of_the_server_pipelines_included(
    redis_cluster_info: Any,
) -> None:
    """Counted by the masters: redis-py's own client asks ``COMMAND GETKEYS`` for a stream
    read, as a command and in a pipeline; a StreamKeysCluster asks it for neither."""
    masters = redis_cluster_info.masters()

    async def getkeys_asked(kind: type[RedisCluster]) -> int:
        client = kind(host="127.0.0.1", port=masters[0])
        try:
            await client.ping()
            before = await asyncio.to_thread(command_calls, masters)
            await client.xread({"{t}a": "0"})
            pipeline = client.pipeline()
            pipeline.xread({"{t}a": "0", "{t}b": "0"})
            await pipeline.execute()
            after = await asyncio.to_thread(command_calls, masters)
        finally:
            await client.aclose()
        return calls_between(before, after, len(masters))["command|getkeys"]

    assert await getkeys_asked(RedisCluster) > 0
    assert await getkeys_asked(StreamKeysCluster) == 0


@pytest.mark.parametrize(
    ("args", "keys"),
    [
        (("XREADGROUP", "GROUP", "g", "c", "COUNT", 5, "STREAMS", "a", ">"), ["a"]),
        (
            (
                "XREADGROUP",
                "GROUP",
                "streams",
                "c",
                "BLOCK",
                0,
                "NOACK",
                "STREAMS",
                "a",
                "b",
                "0",
                "0",
            ),
            ["a", "b"],
        ),
        ((b"xread", b"count", b"1", b"streams", b"k", b"$"), [b"k"]),
        (("XREAD", "STREAMS", "streams", "0"), ["streams"]),
        (("XREAD", "STREAMS", "a", "b", "0"), None),  # odd: not understood, redis-py asks
        (("XREAD", "WHATEVER", "1", "STREAMS", "a", "0"), None),
        (("GET", "k"), None),
    ],
)
def test_a_stream_reads_keys_are_read_from_its_arguments(
    args: tuple[Any, ...], keys: list[Any] | None
) -> None:
    assert stream_read_keys(args[0], args[1:]) == keys


async def test_a_stream_reads_slot_is_found_without_asking_the_server() -> None:
    """No node listens on the port: an answer came from the arguments alone."""
    client = StreamKeysCluster(host="127.0.0.1", port=free_port())
    try:
        read = ("XREADGROUP", "GROUP", "g", "c", "STREAMS", "{t}a", "{t}b", ">", ">")
        assert await client._determine_slot(*read) == client.keyslot("{t}a")
        with pytest.raises(RedisClusterException, match="same key slot"):
            await client._determine_slot("XREAD", "STREAMS", "a", "b", "0", "0")
    finally:
        await client.aclose()
