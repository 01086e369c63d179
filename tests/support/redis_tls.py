"""A private redis-server that speaks only TLS, with a private CA made by ``openssl``.

The folder holds ``ca.crt`` (the CA a client must trust), the server's certificate, and a
client certificate (``client.crt``/``client.key``) signed by the same CA, for a server that
asks clients for one (``client_certs=True``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from .redis_server import free_port, stop_redis


@dataclass(frozen=True)
class TlsRedis:
    port: int
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    def url(self, query: str = "") -> str:
        return f"rediss://127.0.0.1:{self.port}/0{query}"


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def make_certificates(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, in ``folder``."""
    _openssl(folder, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "2", "-subj", "/CN=acp-broker test CA")  # fmt: skip
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl(folder, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
        _openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey",
                 "ca.key", "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                 "-extfile", "san.cnf")  # fmt: skip


def _wait_ready(port: int, folder: Path, proc: subprocess.Popen[bytes]) -> bool:
    client = redis.Redis(
        port=port,
        ssl=True,
        ssl_ca_certs=str(folder / "ca.crt"),
        ssl_certfile=str(folder / "client.crt"),
        ssl_keyfile=str(folder / "client.key"),
        socket_timeout=0.5,
        socket_connect_timeout=0.2,
    )
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    return True
            time.sleep(0.05)
        return False
    finally:
        client.close()


@contextlib.contextmanager
def tls_redis(*, client_certs: bool = False) -> Iterator[TlsRedis]:
    """A TLS-only redis-server; ``client_certs``: it requires a client certificate."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not on PATH"
    folder = Path(tempfile.mkdtemp(prefix="acpb-tls-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        make_certificates(folder)
        for _ in range(5):
            port = free_port()
            proc = subprocess.Popen(
                [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                 "--dir", str(folder), "--save", "", "--appendonly", "no",
                 "--logfile", str(folder / "redis.log"),
                 "--tls-cert-file", str(folder / "server.crt"),
                 "--tls-key-file", str(folder / "server.key"),
                 "--tls-ca-cert-file", str(folder / "ca.crt"),
                 "--tls-auth-clients", "yes" if client_certs else "no"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if _wait_ready(port, folder, proc):
                break
            stop_redis(proc)
            proc = None
        assert proc is not None, "could not start a TLS redis-server"
        yield TlsRedis(port, folder)
    finally:
        if proc is not None:
            stop_redis(proc)
        shutil.rmtree(folder, ignore_errors=True)
