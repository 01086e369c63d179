"""A private Redis Sentinel set for tests: one master, one replica, three Sentinels.

Each process runs on a free port from its own temporary folder (the Sentinels rewrite
their generated configuration files there). The Sentinels declare a master down after
``DOWN_AFTER_MS`` without an answer, so a kill -9 of the master is followed by a failover
within a few seconds.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from .redis_server import free_port, spawn_on_a_free_port, stop_redis

MASTER_NAME = "acpbmaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


@dataclass
class SentinelSet:
    """The processes of a Sentinel set, and what a test does to them."""

    folder: Path
    servers: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    sentinels: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def url(self, scheme: str = "redis+sentinel", auth: str = "", query: str = "") -> str:
        """The broker's URL of this set (``auth``: ``user:pass@``; ``query``: ``?…``)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinels)
        return f"{scheme}://{auth}{hosts}/{MASTER_NAME}/0{query}"

    def sentinel(self, port: int | None = None) -> redis.Redis:
        return redis.Redis(port=port or next(iter(self.sentinels)), socket_timeout=2)

    def master_port(self) -> int:
        """The master's port as the Sentinels tell it now."""
        with self.sentinel() as client:
            _, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def master(self) -> redis.Redis:
        return redis.Redis(port=self.master_port(), socket_timeout=2)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every Sentinel knows the replica and the other Sentinels, and the replica
        is in sync (what a failover needs)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if all(self._knows_all(port) for port in self.sentinels) and self._in_sync():
                    return
            time.sleep(0.1)
        raise TimeoutError("the Sentinel set did not settle")

    def _knows_all(self, port: int) -> bool:
        with self.sentinel(port) as client:
            replicas = client.sentinel_slaves(MASTER_NAME)
            others = client.sentinel_sentinels(MASTER_NAME)
        up = [r for r in replicas if "s_down" not in r["flags"] and "o_down" not in r["flags"]]
        return len(up) >= 1 and len(others) == len(self.sentinels) - 1

    def _in_sync(self) -> bool:
        with self.master() as master:
            info = master.info("replication")
        return (
            info.get("role") == "master"
            and int(info.get("connected_slaves", 0)) >= 1
            and all(info[key]["state"] == "online" for key in info if str(key).startswith("slave"))
        )

    def wait_new_master(self, old: int, timeout: float = 30.0) -> int:
        """The port of the master that replaced ``old``, once it takes writes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                port = self.master_port()
                if port != old:
                    with redis.Redis(port=port, socket_timeout=1) as client:
                        if client.info("replication")["role"] == "master":
                            return port
            time.sleep(0.05)
        raise TimeoutError("no new master")

    def failover(self) -> int:
        """``SENTINEL FAILOVER``: the replica becomes the master; its port once it is."""
        old = self.master_port()
        with self.sentinel() as client:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        return self.wait_new_master(old)

    def kill_master(self) -> int:
        """kill -9 of the master; returns its (old) port."""
        old = self.master_port()
        proc = self.servers[old]
        proc.kill()
        proc.wait()
        return old

    def close(self) -> None:
        for proc in [*self.sentinels.values(), *self.servers.values()]:
            if proc.poll() is None:
                stop_redis(proc)
        shutil.rmtree(self.folder, ignore_errors=True)


def _sentinel_config(folder: Path, port: int, master_port: int) -> Path:
    path = folder / f"sentinel-{port}.conf"
    path.write_text(
        f"port {port}\n"
        "bind 127.0.0.1\n"
        f"dir {folder}\n"
        f"logfile {folder / f'sentinel-{port}.log'}\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {MASTER_NAME} 1\n"
    )
    return path


def _spawn_sentinel(folder: Path, master_port: int) -> tuple[int, subprocess.Popen[bytes]]:
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not on PATH"
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [binary, str(_sentinel_config(folder, port, master_port)), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        client = redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.2)
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    client.close()
                    return port, proc
            time.sleep(0.05)
        client.close()
        stop_redis(proc)
    raise RuntimeError("could not start a Sentinel")


@contextlib.contextmanager
def sentinel_set(*extra: str) -> Iterator[SentinelSet]:
    """A settled Sentinel set (``extra``: options of both data servers); removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="acpb-sentinel-"))
    found = SentinelSet(folder)
    try:
        master_dir, replica_dir = folder / "master", folder / "replica"
        master_dir.mkdir()
        replica_dir.mkdir()
        master_port, master = spawn_on_a_free_port(master_dir, *extra)
        found.servers[master_port] = master
        replica_port, replica = spawn_on_a_free_port(
            replica_dir, "--replicaof", "127.0.0.1", str(master_port), *extra
        )
        found.servers[replica_port] = replica
        for _ in range(3):
            port, proc = _spawn_sentinel(folder, master_port)
            found.sentinels[port] = proc
        found.wait_ready()
        yield found
    finally:
        found.close()
