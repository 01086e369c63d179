"""What broker/compat/redis.py assumes of redis-py, checked by behaviour (real servers, a
real cluster), never by reading redis-py's source: an upgrade that changes one fails here,
by name. CI runs this file at the lowest and the highest redis-py the pin allows
(``.ci/compat``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import hiredis
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, PipelineCommand, RedisCluster
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.compat.redis import (
    BlockingSentinelPool,
    FollowingSentinelConnection,
    GatedCluster,
    PausesBackoff,
    StreamKeysCluster,
    error_from_reply,
    gated,
    packed_by_hiredis,
    stream_read_keys,
)

from .support.client import wait_for
from .support.commandstats import calls_between, command_calls
from .support.redis_server import free_port, redis_server


def test_asyncio_connections_pack_a_pipeline_command_by_command() -> None:
    """The overrides of ``pack_command`` see a pipeline's commands too: redis-py packs
    each of them with it."""
    seen: list[tuple[Any, ...]] = []

    class Recording(Connection):
        def pack_command(self, *args: Any) -> Any:
            seen.append(args)
            return super().pack_command(*args)

    packed = Recording().pack_commands([("SET", "k", "v"), ("GET", "k")])
    assert seen == [("SET", "k", "v"), ("GET", "k")]
    assert b"".join(packed) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n" + (
        b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
    )


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


async def _cut_clients(ports: list[int]) -> None:
    """Every client connection of the servers at ``ports`` closed by the servers."""
    for port in ports:
        async with Redis(port=port) as admin:
            await admin.client_kill_filter(_type="normal", skipme=True)


async def test_redis_pys_cluster_client_reloads_its_map_without_closing_itself(
    redis_cluster_info: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command's and a pipeline's lost connection make redis-py reload the slot map; it
    does so in place (redis-py 8.2 on: the pin's floor), never through the client's own
    ``aclose()``, which would cut every connection in use (a pub/sub reader's included)."""
    closes: list[RedisCluster] = []
    close = RedisCluster.aclose

    async def recorded(client: RedisCluster) -> None:
        closes.append(client)
        await close(client)

    monkeypatch.setattr(RedisCluster, "aclose", recorded)
    masters = redis_cluster_info.masters()
    client = RedisCluster(host="127.0.0.1", port=masters[0], decode_responses=True)
    try:
        await client.set("{t}k", "v")
        for _ in range(2):  # a command, then a pipeline, each on connections cut under it
            await _cut_clients(masters)
            assert await client.get("{t}k") == "v"
            await _cut_clients(masters)
            pipe = client.pipeline()
            pipe.get("{t}k")
            pipe.set("{t}k2", "w")
            assert await pipe.execute() == ["v", True]
        assert closes == []
    finally:
        await client.aclose()


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
    redis_cluster_info: Any,
) -> None:
    """``install_gate`` leans on redis-py building every node it finds (the masters the
    first reload finds, a node a MOVED names) from the client's ``connection_kwargs``, and
    each node opening connections of its ``connection_class``, for its commands and its
    share of a pipeline alike."""
    gate = _Gate()
    masters = redis_cluster_info.masters()
    client = GatedCluster(host="127.0.0.1", port=masters[0], decode_responses=True)
    client.install_gate(gate)
    gate.away = False
    try:
        await client.ping()  # the first reload: every master found
        found = client.get_nodes()
        assert len(found) >= len(masters)
        later = ClusterNode("127.0.0.1", masters[-1], **client.connection_kwargs)
        for node in [*found, later]:
            gate.away = True
            with pytest.raises(_Refused):
                await node.execute_command("PING")
            with pytest.raises(_Refused):
                await node.execute_pipeline([PipelineCommand(0, "PING")])
            gate.away = False
            assert await node.execute_command("PING")
        await later.disconnect()
    finally:
        gate.away = False
        await client.aclose()


async def test_a_gated_cluster_refuses_commands_pipelines_and_reloads_before_redis_py() -> None:
    """Refused before redis-py's cluster machinery runs (no connection is tried: the port
    is free); its pipeline is one of the kind redis-py's ``pipeline()`` makes."""
    gate = _Gate()
    client = GatedCluster(host="127.0.0.1", port=free_port())
    client.install_gate(gate)
    try:
        assert isinstance(client.pipeline(), type(RedisCluster.pipeline(client)))
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


class _OneMaster:
    """Stands in for redis-py's ``Sentinel``: always names ``address`` (a lagging Sentinel
    once the pool follows another), counting the questions."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.asked = 0

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        self.asked += 1
        return self.address


class _Follower:
    def __init__(self) -> None:
        self.started = self.stopped = 0

    def start(self, pool: BlockingSentinelPool) -> None:
        self.started += 1

    async def stop(self) -> None:
        self.stopped += 1


def _address(url: str) -> tuple[str, int]:
    return ("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0]))


def _pool(master: _OneMaster) -> BlockingSentinelPool:
    return BlockingSentinelPool(
        "m",
        master,
        connection_class=FollowingSentinelConnection,
        max_connections=8,
        timeout=5,
        decode_responses=True,
        retry=Retry(NoBackoff(), 2, (ConnectionError,)),
    )


async def _clients(server: Redis, command: str) -> int:
    """How many clients of ``server`` run ``command`` (blocked in it, or last ran it)."""
    return sum(1 for c in await server.client_list() if c.get("cmd") == command)


async def _gone(server: Redis) -> bool:
    return not await _clients(server, "blpop") + await _clients(server, "subscribe")


async def test_a_held_pool_hands_no_connection_to_commands_pipelines_or_subscribers() -> None:
    """Every command, pipeline and subscriber takes its connection with
    ``get_connection``; a connection asks ``get_master_address`` when it connects (which
    starts the follower); the client closes its pool (and the follower) with ``aclose``."""
    mro = BlockingSentinelPool.__mro__
    assert mro.index(SentinelConnectionPool) < mro.index(BlockingConnectionPool)
    with redis_server() as url:
        pool = _pool(_OneMaster(_address(url)))
        pool.follower = follower = _Follower()
        client = Redis.from_pool(pool)
        try:
            assert await client.ping()
            assert follower.started >= 1
            pool.hold(5)
            with pytest.raises(MasterNotFoundError):
                await client.get("k")
            for transaction in (False, True):
                async with client.pipeline(transaction=transaction) as pipe:
                    pipe.set("k", "v")
                    with pytest.raises(MasterNotFoundError):
                        await pipe.execute()
            pubsub = client.pubsub()
            with pytest.raises(MasterNotFoundError):
                await pubsub.subscribe("ch")
            await pubsub.aclose()
            pool.hold(0)
            assert await client.get("k") is None  # nothing of them ran
        finally:
            await client.aclose()
        assert follower.stopped == 1


async def test_a_followed_switch_moves_idle_in_use_and_new_connections_to_the_new_master() -> None:
    with redis_server() as first_url, redis_server() as second_url:
        first, second = _address(first_url), _address(second_url)
        sentinels = _OneMaster(first)
        pool = _pool(sentinels)
        client = Redis.from_pool(pool)
        pubsub = client.pubsub()
        old = Redis(port=first[1], decode_responses=True)
        try:
            await asyncio.gather(*(client.blpop(["idle"], 0.05) for _ in range(4)))
            await pubsub.subscribe("ch")
            blocked: asyncio.Task[Any] = asyncio.ensure_future(client.blpop(["list"], 0))
            await wait_for(lambda: _clients(old, "blpop"), what="the read sent")
            # A connection opened to the old master as the pool switches (not in the pool)
            straggler = pool.make_connection()
            await straggler.connect()
            assert (straggler.host, straggler.port) == first

            pool.hold(5)  # a failover under way: no connection handed out
            with pytest.raises(MasterNotFoundError):
                await client.get("k")
            assert await pool.follow(second)  # the hold ends
            assert not await pool.follow(second)
            assert await pool.get_master_address() == second
            await wait_for(lambda: _gone(old), what="idle and in use alike closed")

            async with Redis(port=second[1], decode_responses=True) as direct:
                await client.set("k", "v")  # a connection the pool had: now on the second
                assert await direct.get("k") == "v"
                await straggler.send_command("SET", "s", "1")  # moved before it sends
                assert await straggler.read_response() == "OK"
                assert await direct.get("s") == "1"
                await straggler.disconnect()
                # A connection the server cut reconnects to the followed master, without
                # asking the Sentinels (which still name the old one).
                asked = sentinels.asked
                await direct.client_kill_filter(_type="normal", skipme=True)
                await client.set("k2", "v2")
                assert await direct.get("k2") == "v2"
                assert sentinels.asked == asked
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
            assert await old.get("k") is None and await old.get("s") is None
        finally:
            await old.aclose()
            await pubsub.aclose()
            await client.aclose()


# -- StreamKeysCluster ---------------------------------------------------------------------------


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


async def test_a_stream_reads_keys_are_found_without_asking_the_server() -> None:
    """No node listens on the port: an answer came from the arguments alone; another
    command's keys are the parser's own (it asks the server: none here)."""
    client = StreamKeysCluster(host="127.0.0.1", port=free_port())
    try:
        read = ("XREADGROUP", "GROUP", "g", "c", "STREAMS", "{t}a", "{t}b", ">", ">")
        assert await client.commands_parser.get_keys(*read) == ["{t}a", "{t}b"]
        with pytest.raises(RedisClusterException):  # a slot of its own for each key
            await client.xread({"a": "0", "b": "0"})
    finally:
        await client.aclose()


# -- PausesBackoff ------------------------------------------------------------------------------


async def test_redis_pys_retry_asks_the_backoff_the_pause_after_each_failure_counted_from_one() -> (
    None
):
    asked: list[int] = []
    calls: list[int] = []

    def pause(failures: int) -> float:
        asked.append(failures)
        return 0.0

    async def failing() -> None:
        calls.append(1)
        raise RedisConnectionError("cut")

    async def failed(error: Exception) -> None:
        pass

    with pytest.raises(RedisConnectionError):
        await Retry(PausesBackoff(pause), 2, (RedisConnectionError,)).call_with_retry(
            failing, failed
        )
    assert asked == [1, 2] and len(calls) == 3


# -- error_from_reply ---------------------------------------------------------------------------


async def _bare_error(port: int, *command: Any) -> str:
    """The text of the error reply the server at ``port`` gives to ``command``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(hiredis.pack_command(command))
        parser = hiredis.Reader()
        while (reply := parser.gets()) is False:
            parser.feed(await reader.read(1 << 16))
        assert isinstance(reply, hiredis.ReplyError)
        return str(reply)
    finally:
        writer.close()


async def test_an_error_reply_read_bare_fails_as_the_same_reply_through_the_client(
    redis_url: str,
) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    async with Redis(port=port) as client:
        await client.set("k", "v")
        for command in [("HGET", "k", "f"), ("EVALSHA", "0" * 40, "0"), ("NOSUCHCOMMAND",)]:
            with pytest.raises(RedisError) as through_the_client:
                await client.execute_command(*command)
            bare = error_from_reply(await _bare_error(port, *command))
            assert type(bare) is type(through_the_client.value), command
            assert str(bare) == str(through_the_client.value)
