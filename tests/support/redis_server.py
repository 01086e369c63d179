"""Private redis-server processes for tests: started on free ports in temporary folders."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")
        with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
            if client.ping():
                client.close()
                return
        time.sleep(0.02)
    raise TimeoutError(f"redis-server on port {port} did not start")


def spawn_redis(port: int, folder: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Start a redis-server on ``port`` that keeps its files in ``folder``; wait until ready."""
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
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(port, proc)
    except BaseException:
        stop_redis(proc)
        raise
    return proc


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
    port = free_port()
    proc = spawn_redis(port, folder, *extra)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_redis(proc)
        shutil.rmtree(folder, ignore_errors=True)


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
        self.port = free_port()
        self.aof = aof
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def _options(self) -> tuple[str, ...]:
        return ("--appendonly", "yes", "--appendfsync", "always") if self.aof else ()

    def start(self) -> None:
        self.proc = spawn_redis(self.port, self.folder, *self._options())

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
