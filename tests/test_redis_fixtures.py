"""The fixtures' own redis-servers: a port taken between its choice and the server's bind is
chosen again, not a failed fixture (which would fail every test that shares it)."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest
import redis

from .support.redis_server import (
    PortTaken,
    ephemeral_ports,
    free_port,
    spawn_on_a_free_port,
    spawn_redis,
    stop_redis,
)


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    sock.listen()
    return sock


def test_free_ports_lie_below_the_ephemeral_range() -> None:
    assert all(free_port() < ephemeral_ports().start for _ in range(20))


def test_a_taken_port_is_reported_as_taken_with_the_servers_words() -> None:
    with (
        _listener() as taken,
        tempfile.TemporaryDirectory() as folder,
        pytest.raises(PortTaken, match="Address already in use"),
    ):
        spawn_redis(taken.getsockname()[1], Path(folder))


def test_a_taken_port_is_chosen_again() -> None:
    with _listener() as taken, tempfile.TemporaryDirectory() as folder:
        choices = iter([taken.getsockname()[1], free_port()])
        port, proc = spawn_on_a_free_port(Path(folder), choose=lambda: next(choices))
        try:
            assert port != taken.getsockname()[1]
            assert redis.Redis(port=port).ping()
        finally:
            stop_redis(proc)
