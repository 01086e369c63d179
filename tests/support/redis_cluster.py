"""A private Redis Cluster for tests: 3 masters and 3 replicas from redis-server processes."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from .redis_server import ephemeral_ports, free_port, port_is_free, spawn_on_a_free_port, stop_redis


@dataclass
class ClusterInfo:
    url: str  # redis+cluster://… as the broker takes it
    ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)  # by port

    def wait_synced(self, master_port: int, timeout: float = 30.0) -> None:
        """Wait until the replica of ``master_port`` has synced with it: a replica that never
        did does not take over (its data's age is unknown). Blocking."""
        replica = self.replica_of(master_port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.client(replica) as node:
                if node.info("replication")["master_link_status"] == "up":
                    return
            time.sleep(0.1)
        raise TimeoutError(f"the replica of {master_port} never synced")

    def pause(self, port: int) -> None:
        """SIGSTOP the node at ``port``: it answers nothing (past the node timeout, its
        replica takes over and the cluster is down for its slots meanwhile)."""
        self.procs[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGCONT)

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

    def masters(self) -> list[int]:
        """The ports of the masters now, each once (a master may serve several ranges)."""
        with self.client(self.ports[0]) as any_node:
            return sorted({int(shard[2][1]) for shard in any_node.execute_command("CLUSTER SLOTS")})

    def migrate_slot(self, slot: int, target: int, *, batch: int = 2, pace: float = 0.05) -> None:
        """Move ``slot`` to the master at port ``target`` by hand, as ``redis-cli --cluster
        reshard`` does (SETSLOT IMPORTING and MIGRATING, MIGRATE the keys, SETSLOT NODE),
        ``batch`` keys at a time with ``pace`` seconds between batches, so that traffic meets
        the slot half moved: ASK and TRYAGAIN for its keys. Blocking: call it through
        ``asyncio.to_thread`` from a test's loop."""
        source = self.master_of_slot(slot)
        if source == target:
            return
        with self.client(source) as src, self.client(target) as dst:
            src_id = src.execute_command("CLUSTER MYID")
            dst_id = dst.execute_command("CLUSTER MYID")
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
            while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, batch):
                src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
                time.sleep(pace)  # pacing the fault, not waiting for a condition
            for port in [target, source, *(p for p in self.masters() if p not in (source, target))]:
                with self.client(port) as node:
                    node.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)

    def master_of_quietly(self, session_id: str) -> int | None:
        """The port of the master serving a session's keys, asked of any node that answers
        (None: none does, or none serves the slot now). Blocking."""
        from broker.store.keys import SessionKeys

        key = SessionKeys("default", session_id).log
        for port in self.ports:
            quick = redis.Redis(port=port, decode_responses=True, socket_timeout=0.5)
            with contextlib.suppress(redis.RedisError), quick as node:
                slot = int(node.execute_command("CLUSTER KEYSLOT", key))
                for start, end, master, *_ in node.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        return int(master[1])
        return None

    def master_of_slot(self, slot: int) -> int:
        with self.client(self.ports[0]) as any_node:
            for start, end, master, *_ in any_node.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise AssertionError(f"no master serves slot {slot}")

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
    ports: list[int] = []
    procs = []
    try:
        for node in range(masters * (1 + replicas)):
            folder = root / str(node)
            folder.mkdir()
            port, proc = spawn_on_a_free_port(folder, *_CLUSTER_OPTIONS, choose=_cluster_port)
            ports.append(port)
            procs.append(proc)
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
        info = ClusterInfo(
            f"redis+cluster://127.0.0.1:{ports[0]}", ports, dict(zip(ports, procs, strict=True))
        )
        info.wait_ok()
        yield info
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)  # a test that paused one and failed
            stop_redis(proc)
        shutil.rmtree(root, ignore_errors=True)


_CLUSTER_OPTIONS = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
)


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below the ephemeral range."""
    for _ in range(200):
        port = free_port(below=ephemeral_ports().start - 10000)
        if port_is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")
