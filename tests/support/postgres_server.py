"""Private PostgreSQL servers for tests: ``initdb`` in a temporary folder, a free port, a
unix socket in that folder and, unless asked for, no TCP listener (the machine's own server
is never used).

PostgreSQL refuses to run as root: under root the server runs as the ``postgres`` user
(``runuser``), in a folder that user owns."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .redis_server import free_port

BIN = Path(os.environ.get("ACP_BROKER_TEST_PG_BIN", "/usr/local/bin"))


def _as_owner(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def postgres_available() -> bool:
    return (BIN / "initdb").exists() or shutil.which("initdb") is not None


@contextlib.contextmanager
def postgres_server(*, tcp: bool = False) -> Iterator[str]:
    """A PostgreSQL server of our own; yields its DSN and removes it afterwards. It listens
    on its unix socket only, and with ``tcp`` on 127.0.0.1 too (the DSN then names that:
    a benchmark compares it with servers reached over loopback TCP)."""
    initdb = str(BIN / "initdb") if (BIN / "initdb").exists() else "initdb"
    pg_ctl = str(Path(initdb).resolve().parent / "pg_ctl")
    folder = Path(tempfile.mkdtemp(prefix="acpb-pg-"))
    data, socket_dir = folder / "data", folder / "run"
    socket_dir.mkdir()
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in (folder, socket_dir):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    port = free_port()
    subprocess.run(
        _as_owner([initdb, "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"]),
        check=True,
        timeout=120,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listen = "127.0.0.1" if tcp else ""
    options = f"-p {port} -k {socket_dir} -c listen_addresses='{listen}' -c fsync=off"
    subprocess.run(
        _as_owner([pg_ctl, "-D", str(data), "-o", options, "-w", "-t", "60", "start"]),
        check=True,
        timeout=90,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if tcp:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        else:
            yield f"postgresql://postgres@/postgres?host={socket_dir}&port={port}"
    finally:
        subprocess.run(
            _as_owner([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
            timeout=60,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        shutil.rmtree(folder, ignore_errors=True)
