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

from .redis_server import free_port, stop_redis
from .redis_tls import make_certificates

MASTER_NAME = "acpbmaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


@dataclass
class SentinelSet:
    """The processes of a Sentinel set, and what a test does to them."""

    folder: Path
    tls: Path | None = None
    """The folder of the CA and certificates when every process speaks TLS only."""
    sentinel_password: str | None = None
    """The Sentinels' own ``requirepass`` (the data servers keep none)."""
    servers: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    sentinels: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def url(self, auth: str = "", query: str = "") -> str:
        """The broker's URL of this set (``auth``: ``user:pass@``; ``query``: ``&…``)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinels)
        if self.tls is None:
            return f"redis+sentinel://{auth}{hosts}/{MASTER_NAME}/0{'?' + query if query else ''}"
        trust = f"?ssl_ca_certs={self.tls / 'ca.crt'}{'&' + query if query else ''}"
        return f"rediss+sentinel://{auth}{hosts}/{MASTER_NAME}/0{trust}"

    def client(self, port: int, timeout: float = 2.0) -> redis.Redis:
        return _client(port, self.tls, timeout)

    def sentinel(self, port: int | None = None) -> redis.Redis:
        port = port or next(iter(self.sentinels))
        return _client(port, self.tls, 2.0, self.sentinel_password)

    def master_port(self) -> int:
        """The master's port as the Sentinels tell it now."""
        with self.sentinel() as client:
            _, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def master(self) -> redis.Redis:
        return self.client(self.master_port())

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
                    with self.client(port, 1.0) as client:
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


def _client(
    port: int, tls: Path | None, timeout: float, password: str | None = None
) -> redis.Redis:
    return redis.Redis(
        port=port,
        password=password,
        ssl=tls is not None,
        ssl_ca_certs=str(tls / "ca.crt") if tls is not None else None,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )


def _tls_options(tls: Path | None) -> list[str]:
    """A process's TLS options (``--name value`` pairs; a config file takes them as lines)."""
    if tls is None:
        return []
    return [
        "--tls-cert-file", str(tls / "server.crt"), "--tls-key-file", str(tls / "server.key"),
        "--tls-ca-cert-file", str(tls / "ca.crt"), "--tls-auth-clients", "no",
        "--tls-replication", "yes",
    ]  # fmt: skip


def _port_options(port: int, tls: Path | None) -> list[str]:
    return ["--port", str(port)] if tls is None else ["--port", "0", "--tls-port", str(port)]


def _spawn(
    args: list[str], tls: Path | None, folder: Path, what: str, password: str | None = None
) -> tuple[int, subprocess.Popen[bytes]]:
    """``redis-server ARGS`` plus its port options, on a free port, once it answers."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not on PATH"
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [binary, *args, *_port_options(port, tls), "--logfile", str(folder / f"{port}.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        with _client(port, tls, 0.5, password) as client:
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return port, proc
                time.sleep(0.05)
        stop_redis(proc)
    raise RuntimeError(f"could not start {what}")


def _sentinel_config(
    folder: Path, master_port: int, tls: Path | None, password: str | None
) -> Path:
    path = folder / f"sentinel-{time.monotonic_ns()}.conf"
    options = _tls_options(tls)
    lines = [f"{options[i][2:]} {options[i + 1]}" for i in range(0, len(options), 2)]
    if password:  # the Sentinels ask it of clients, and give it to each other
        lines += [f"requirepass {password}", f"sentinel sentinel-pass {password}"]
    path.write_text(
        "bind 127.0.0.1\n"
        f"dir {folder}\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {MASTER_NAME} 1\n" + "".join(f"{line}\n" for line in lines)
    )
    return path


@contextlib.contextmanager
def sentinel_set(
    *extra: str, tls: bool = False, sentinel_password: str | None = None
) -> Iterator[SentinelSet]:
    """A settled Sentinel set (``extra``: options of both data servers; ``tls``: every
    process speaks TLS only, with a private CA; ``sentinel_password``: the Sentinels
    require it); removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="acpb-sentinel-"))
    found = SentinelSet(folder, sentinel_password=sentinel_password)
    try:
        if tls:
            found.tls = folder / "tls"
            found.tls.mkdir()
            make_certificates(found.tls)
        data = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        data += _tls_options(found.tls)
        for role in ("master", "replica"):
            (folder / role).mkdir()
            args = [*data, "--dir", str(folder / role), *extra]
            if role == "replica":
                args += ["--replicaof", "127.0.0.1", str(next(iter(found.servers)))]
            port, proc = _spawn(args, found.tls, folder / role, f"the {role}")
            found.servers[port] = proc
        master_port = next(iter(found.servers))
        for _ in range(3):
            config = _sentinel_config(folder, master_port, found.tls, sentinel_password)
            port, proc = _spawn(
                [str(config), "--sentinel"], found.tls, folder, "a Sentinel", sentinel_password
            )
            found.sentinels[port] = proc
        found.wait_ready()
        yield found
    finally:
        found.close()
