"""Private redis-server processes for tests: started on free ports in temporary folders."""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

LOWEST_PORT = 10000


def ephemeral_ports() -> range:
    """The ports the kernel hands out as source ports of outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(int(low), int(high) + 1)


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(below: int | None = None) -> int:
    """A port nothing listens on, chosen below the ephemeral range (and below ``below``).

    A port the kernel picks (bind to 0) lies in the ephemeral range, where any outgoing
    connection on the machine may take it before our server binds it; below that range only
    another listener can.
    """
    ceiling = min(ephemeral_ports().start, below or 65536)
    for _ in range(200):
        port = random.randrange(LOWEST_PORT, ceiling)
        if port_is_free(port):
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortTaken(RuntimeError):
    """redis-server could not bind its port: something took it after we chose it."""


def _exited(port: int, proc: subprocess.Popen[bytes], log: Path) -> RuntimeError:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    said = " / ".join(line.strip() for line in lines[-3:])
    kind = PortTaken if "Address already in use" in said else RuntimeError
    return kind(f"redis-server on port {port} exited with {proc.returncode}: {said}")


def _wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    # A read timeout too: until our server fails to bind, a foreign listener on the port may
    # accept the ping and never answer it.
    client = redis.Redis(
        port=port, socket_connect_timeout=0.2, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _exited(port, proc, log)
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            if client.ping():
                client.close()
                return
        time.sleep(0.02)
    raise TimeoutError(f"redis-server on port {port} did not start")


def spawn_redis(port: int, folder: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Start a redis-server on ``port`` that keeps its files (and its log, ``redis.log``) in
    ``folder``; wait until ready. Raises :class:`PortTaken` if the port was not free."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH (.ci/run installs it)")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(folder / "redis.log"),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(port, proc, folder / "redis.log")
    except BaseException:
        stop_redis(proc)
        raise
    return proc


def spawn_on_a_free_port(
    folder: Path, *extra: str, choose: Callable[[], int] = free_port
) -> tuple[int, subprocess.Popen[bytes]]:
    """Start a redis-server on a port from ``choose``, choosing again if it was taken between
    the choice and the server's bind; returns the port and the process."""
    for _ in range(4):
        port = choose()
        try:
            return port, spawn_redis(port, folder, *extra)
        except PortTaken:
            continue
    port = choose()
    return port, spawn_redis(port, folder, *extra)


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def redis_server(*extra: str) -> Iterator[str]:
    """A redis-server of our own; yields its URL and removes it afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="acpb-redis-"))
    port, proc = spawn_on_a_free_port(folder, *extra)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_redis(proc)
        shutil.rmtree(folder, ignore_errors=True)


def port_of(url: str) -> int:
    """The port of a ``redis://127.0.0.1:PORT/DB`` URL (one of :func:`redis_server`'s)."""
    return int(url.rsplit(":", 1)[1].split("/")[0])


@contextlib.contextmanager
def master_with_replica() -> Iterator[tuple[str, str]]:
    """A redis-server and a replica of it, online (waited for, 10 s at most): their URLs."""
    with (
        redis_server() as master,
        redis_server("--replicaof", "127.0.0.1", str(port_of(master))) as replica,
    ):
        with redis.Redis.from_url(master) as admin:
            deadline = time.monotonic() + 10
            while admin.info("replication").get("slave0", {}).get("state") != "online":
                assert time.monotonic() < deadline, "the replica did not come online"
                time.sleep(0.05)
        yield master, replica


@contextlib.contextmanager
def password_server(password: str) -> Iterator[str]:
    """A redis-server of our own that requires ``password``; yields its URL (without the
    password). It is set once the server is up: from the start it would keep the readiness
    check out."""
    with redis_server() as url:
        with redis.Redis.from_url(url) as admin:
            admin.config_set("requirepass", password)
        yield url


class RestartableRedis:
    """A redis-server of our own that a fault test kills, restarts and stalls, on one port.

    ``aof``: with the append-only file on (fsync on every write), a restart keeps every
    write Redis acknowledged.
    """

    def __init__(self, *, aof: bool) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="acpb-redis-"))
        self.port = 0  # chosen at the first start, kept across restarts
        self.aof = aof
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _options(self) -> tuple[str, ...]:
        return ("--appendonly", "yes", "--appendfsync", "always") if self.aof else ()

    def start(self) -> None:
        if self.port:
            self.proc = spawn_redis(self.port, self.folder, *self._options())
        else:
            self.port, self.proc = spawn_on_a_free_port(self.folder, *self._options())

    def kill(self) -> None:
        """SIGKILL, as a crash would (what the append-only file holds survives)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def wipe(self) -> None:
        """Forget every file: the next start is an empty Redis."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir()

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections and answers nothing (a stall)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def require_password(self, password: str) -> str:
        """Have the server require ``password`` from now on; returns its URL with it."""
        with redis.Redis(port=self.port) as admin:
            admin.config_set("requirepass", password)
        return self.url.replace("redis://", f"redis://:{password}@")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            stop_redis(self.proc)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def restartable_redis(*, aof: bool) -> Iterator[RestartableRedis]:
    server = RestartableRedis(aof=aof)
    server.start()
    try:
        yield server
    finally:
        server.close()
