"""What broker/compat/redis.py assumes of redis-py's internals: an upgrade that changes one
fails here, by name."""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.cluster import PipelineStrategy, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection
from redis.connection import HiredisRespSerializer

from broker.compat.redis import RELOADERS, ReloadingCluster, packed_by_hiredis


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


def test_redis_py_still_reloads_its_slot_map_by_closing_itself_where_we_expect() -> None:
    """ReloadingCluster.aclose() tells redis-py's own reload calls by their function names."""
    assert "await self.aclose()" in inspect.getsource(RedisCluster._execute_command)
    assert "cluster_client.aclose()" in inspect.getsource(PipelineStrategy.execute)
    assert {"_execute_command", "execute"} == RELOADERS


async def test_a_close_asked_by_the_broker_closes_and_one_from_redis_py_only_reloads() -> None:
    client = ReloadingCluster(host="127.0.0.1", port=1)
    client._initialize = False  # as once initialized

    async def _execute_command() -> None:  # named as redis-py's, but not in its module
        await client.aclose()

    await _execute_command()
    assert client._initialize  # closed for real: RedisCluster.aclose sets it too
    await client.aclose()
