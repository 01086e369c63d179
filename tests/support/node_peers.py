"""The tests' Node peers (``tests/ts``: the ACP TypeScript SDK, acpx), installed once.

``make test`` installs them before pytest's workers start. A test run without it (``pytest``
straight) installs them here, under a file lock: two xdist workers running ``npm ci`` in
the same folder at once break each other's install (``ETXTBSY``, ``TAR_ENTRY_ERROR``).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

TS = Path(__file__).resolve().parent.parent / "ts"
STAMP = TS / "node_modules" / ".installed"
"""Touched once the lockfile's packages are installed (the Makefile's stamp too)."""


def node_peers() -> Path:
    """``tests/ts`` with its lockfile's packages installed (``npm ci``, at most once)."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not on the PATH: install Node.js (.ci/run does)")
    with open(TS / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker installs meanwhile: wait
        if not _current():
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund"], cwd=TS, check=True, timeout=600
            )
            STAMP.touch()
    return TS


def _current() -> bool:
    if not STAMP.exists():
        return False
    made = STAMP.stat().st_mtime
    return all(
        made >= (TS / name).stat().st_mtime for name in ("package.json", "package-lock.json")
    )
