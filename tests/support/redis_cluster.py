"""A private Redis Cluster for tests: 3 masters and 3 replicas from redis-server processes."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from .redis_server import spawn_redis, stop_redis


@dataclass
class ClusterInfo:
    url: str  # redis+cluster://… as the broker takes it
    ports: list[int]

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True)

    def master_of(self, key: str) -> int:
        """The port of the master that serves ``key`` now."""
        with self.client(self.ports[0]) as any_node:
            slot = int(any_node.execute_command("CLUSTER KEYSLOT", key))
            for start, end, master, *_ in any_node.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise AssertionError(f"no master serves slot {slot}")

    def replica_of(self, master_port: int) -> int:
        with self.client(master_port) as master:
            info = master.info("replication")
        return int(info["slave0"]["port"])

    def promote(self, replica_port: int) -> None:
        """Make a replica its master's master (``CLUSTER FAILOVER``, as an operator would);
        blocking: call it through ``asyncio.to_thread`` from a test's loop."""
        subprocess.run(
            ["redis-cli", "-p", str(replica_port), "CLUSTER", "FAILOVER"],
            check=True,
            capture_output=True,
            timeout=10,
        )

    def wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for port in self.ports:
                with contextlib.suppress(redis.RedisError), self.client(port) as node:
                    states.append(node.cluster("info")["cluster_state"])
            if states.count("ok") == len(self.ports):
                return
            time.sleep(0.1)
        raise TimeoutError("the test cluster never became healthy")


@contextlib.contextmanager
def redis_cluster(masters: int = 3, replicas: int = 1) -> Iterator[ClusterInfo]:
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("redis-cli must be on PATH (.ci/run installs it)")
    root = Path(tempfile.mkdtemp(prefix="acpb-cluster-"))
    ports = [_cluster_port() for _ in range(masters * (1 + replicas))]
    procs = []
    try:
        for port in ports:
            folder = root / str(port)
            folder.mkdir()
            procs.append(
                spawn_redis(
                    port,
                    folder,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                )
            )
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *[f"127.0.0.1:{p}" for p in ports],
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        info = ClusterInfo(f"redis+cluster://127.0.0.1:{ports[0]}", ports)
        info.wait_ok()
        yield info
    finally:
        for proc in procs:
            stop_redis(proc)
        shutil.rmtree(root, ignore_errors=True)


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free and valid too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port > 55535:
            port = random.randint(20000, 45000)
        if _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
