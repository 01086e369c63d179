"""Private redis-server processes for tests: started on free ports in temporary folders."""

from __future__ import annotations

import contextlib
import shutil
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
