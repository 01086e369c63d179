"""Sealing an agent process with bubblewrap (``bwrap``): what it sees, what it may write.

An agent runs tenants' prompts and may run what they ask (a shell command, a file read).
Unsealed it is a child of the agent host as the same user: ``/proc/$PPID/environ`` and
``/proc/$PPID/cmdline`` hand it the host's secrets, and every file the host can read is
its to read. Sealed, it runs in its own namespaces:

* its own PID namespace: ``/proc`` shows its own processes only, the host's are not there
  to read or to signal;
* its own mount namespace: the system (``/usr``, ``/etc``, the libraries, Python and the
  agent's own installation) read-only, the session's ``cwd`` and ``additionalDirectories``
  (and the spec's ``rw_paths``) writable, a private ``/tmp`` of a bounded size, a fresh
  ``/dev``; everything else is absent, and what must stay hidden even inside a visible
  tree (the configuration file, files holding secrets, the archive folder) is covered;
* its own IPC and UTS namespaces, no network when its spec says ``network = false``, a new
  terminal session (no input injection into the host's terminal), every capability
  dropped when the host runs as root, and it dies with the host (``--die-with-parent``).

The process's environment is the filtered one (:mod:`.environment`), given to ``bwrap``
itself, so the sandbox's own first process shows nothing more.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from broker.config import AgentSpec, Settings

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""What every sealed agent sees read-only (where it exists): the programs and libraries a
command needs."""

SEALED_ENV = {"TMPDIR": "/tmp"}
"""What a sealed agent's environment says differently: the host's ``TMPDIR`` is not there."""

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""Where this installation's ``broker`` and ``workers`` packages are."""
_NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
_PROBE_TIMEOUT = 10.0


class SandboxRefused(Exception):
    """A sealed agent cannot be started as asked (a working directory that cannot be
    sealed); the message says why in one line."""


@dataclass(frozen=True)
class Sealing:
    """Whether this host can seal agents: the ``bwrap`` found and tried, or why not."""

    bwrap: str | None
    version: str = ""
    problem: str = ""

    @property
    def works(self) -> bool:
        return self.bwrap is not None and not self.problem

    def describe(self) -> str:
        """One line for the start-up log and ``doctor``."""
        if self.works:
            return (
                f"agents run sealed by {self.version} ({self.bwrap}): own PID, mount, IPC "
                "and UTS namespaces, the system read-only, only the session's directories "
                "writable, a private /tmp"
            )
        return f"agents cannot be sealed: {self.problem}"


async def probe(bwrap: str | None = None) -> Sealing:
    """Find ``bwrap`` and start a sealed ``true`` with it, with the flags agents get."""
    path = bwrap or shutil.which("bwrap")
    if path is None:
        return Sealing(None, problem="bwrap (bubblewrap) is not installed")
    try:
        version = await _run([path, "--version"])
        plan = SandboxPlan(path, tmp_bytes=1024 * 1024, hidden=())
        await _run(plan.command(["true"], [], network=False))
    except (OSError, RuntimeError, TimeoutError) as exc:
        return Sealing(path, problem=f"{path} does not work here: {_first_line(str(exc))}")
    return Sealing(path, version=version.strip() or "bwrap")


async def _run(argv: Sequence[str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), _PROBE_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(err.decode(errors="replace").strip() or f"exit {proc.returncode}")
    return out.decode(errors="replace")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no reason given"


@dataclass(frozen=True)
class SandboxPlan:
    """How a host seals its agents: the ``bwrap`` to use, the size of a private ``/tmp``,
    the paths no agent may see (the broker's configuration, secrets and state)."""

    bwrap: str
    tmp_bytes: int
    hidden: tuple[str, ...]

    def command(
        self,
        command: Sequence[str],
        writable: Sequence[str],
        *,
        network: bool,
        readable: Sequence[str] = (),
    ) -> list[str]:
        """The ``bwrap`` command line that runs ``command`` sealed, ``writable`` (the
        session's directories, the spec's ``rw_paths``) writable where they exist,
        ``readable`` (the spec's ``ro_paths``) read-only. Raises :class:`SandboxRefused`
        for a writable ``/`` (the whole file system would be the agent's)."""
        for path in writable:
            if os.path.normpath(path) == "/":
                raise SandboxRefused(
                    "a sealed agent cannot be given / as a working directory (it would see "
                    "and write the whole file system)"
                )
        command = [_absolute(arg) for arg in command]
        argv = [self.bwrap, "--die-with-parent", "--new-session", *_NAMESPACES]
        if not network:
            argv.append("--unshare-net")
        if os.geteuid() == 0:  # root's capabilities would let it undo every mount below
            argv += ["--cap-drop", "ALL"]
        seen = _unique([*SYSTEM_PATHS, *_python_paths(), *_command_paths(command), *readable])
        for path in seen:
            argv += ["--ro-bind-try", path, path]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--size", str(self.tmp_bytes), "--tmpfs", "/tmp"]
        rw = _unique(writable)
        for path in rw:
            argv += ["--bind-try", path, path]
        argv += self._covers([*seen, *rw])
        start = next((path for path in rw if os.path.isdir(path)), "/")
        argv += ["--chdir", start, "--", *command]
        return argv

    def _covers(self, visible: Sequence[str]) -> list[str]:
        """Mounts over the hidden paths that lie in a visible tree: an empty folder over a
        folder, an empty file over a file."""
        argv: list[str] = []
        for path in self.hidden:
            if not any(_within(path, root) for root in visible):
                continue
            if os.path.isdir(path):
                argv += ["--tmpfs", path]
            elif os.path.exists(path):
                argv += ["--ro-bind", "/dev/null", path]
        return argv


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _unique(paths: Iterable[str]) -> list[str]:
    """Normalized absolute paths, each once, in order; a path inside another kept too (it
    may be a separate mount or a symbolic link's target)."""
    out: list[str] = []
    for path in paths:
        norm = os.path.normpath(path)
        if os.path.isabs(norm) and norm not in out:
            out.append(norm)
    return out


def _absolute(arg: str) -> str:
    """A command argument that names an existing relative path, made absolute: the sealed
    process starts in the session's directory, not the host's."""
    if not os.path.isabs(arg) and os.sep in arg and os.path.exists(arg):
        return os.path.abspath(arg)
    return arg


def _python_paths() -> list[str]:
    """This Python's installation and import path: an agent written in Python (the demo
    agent, ``acp-broker demo-agent``) runs on it."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.realpath(sys.executable)]
    paths.append(_PACKAGE_ROOT)  # an editable install's packages live there, off sys.path
    paths += [entry for entry in sys.path if entry and os.path.isdir(entry)]
    return [path if os.path.isdir(path) else os.path.dirname(path) for path in paths]


def _command_paths(command: Sequence[str]) -> list[str]:
    """The agent's own installation: its executable's folder (and its real one, through a
    symbolic link) and the folder of every argument that names a file."""
    paths: list[str] = []
    found = shutil.which(command[0]) if command else None
    if found:
        paths += [os.path.dirname(found), os.path.dirname(os.path.realpath(found))]
    for arg in command[1:]:
        if os.path.isabs(arg) and os.path.exists(arg):
            real = os.path.realpath(arg)
            paths += [os.path.dirname(arg), os.path.dirname(real)]
    return paths


@dataclass(frozen=True)
class SandboxPolicy:
    """The host's sandbox settings: ``mode`` (``auto``, ``on``, ``off``; an agent spec's
    own ``sandbox`` wins), the size of a private ``/tmp``, the paths to hide."""

    mode: str = "auto"
    tmp_bytes: int = 256 * 1024 * 1024
    hidden: tuple[str, ...] = ()


class Sealer:
    """Decides, per agent spec, whether its processes run sealed, and how: ``bwrap`` is
    found and tried once, at the first need."""

    def __init__(self, policy: SandboxPolicy) -> None:
        self.policy = policy
        self._sealing: Sealing | None = None
        self._lock = asyncio.Lock()

    async def sealing(self) -> Sealing:
        async with self._lock:
            if self._sealing is None:
                self._sealing = await probe()
            return self._sealing

    def wanted(self, spec: AgentSpec) -> bool | None:
        """True: must run sealed; False: runs unsealed; None: sealed where it can be."""
        if spec.sandbox is not None:
            return spec.sandbox
        return None if self.policy.mode == "auto" else self.policy.mode == "on"

    async def plan(self, spec: AgentSpec) -> SandboxPlan | None:
        """How to seal ``spec``'s processes (None: they run unsealed). Raises
        :class:`SandboxRefused` when it must run sealed and this host cannot seal it."""
        wanted = self.wanted(spec)
        if wanted is False:
            return None
        sealing = await self.sealing()
        if sealing.works and sealing.bwrap is not None:
            return SandboxPlan(sealing.bwrap, self.policy.tmp_bytes, self.policy.hidden)
        if wanted is None:
            return None
        raise SandboxRefused(
            f"agent {spec.name!r} is not run: it must run sealed and {sealing.problem}"
        )

    async def describe(self, specs: Sequence[AgentSpec]) -> tuple[str, bool]:
        """The start-up line: how this host's agents run; and whether it is a warning (an
        agent runs unsealed, or is refused)."""
        wanted = {spec.name: self.wanted(spec) for spec in specs}
        if all(want is False for want in wanted.values()):
            return f"agents run UNSEALED (sandbox off): {', '.join(wanted)}", True
        sealing = await self.sealing()
        sealed = [name for name, want in wanted.items() if want is not False and sealing.works]
        off = [name for name, want in wanted.items() if want is False]
        unsealable = [name for name, want in wanted.items() if want is None and not sealing.works]
        refused = [name for name, want in wanted.items() if want and not sealing.works]
        parts = [f"{sealing.describe()}: {', '.join(sealed)}"] if sealed else []
        for names, why in ((unsealable, sealing.problem), (off, "sandbox off")):
            if names:
                parts.append(
                    f"agents run UNSEALED ({why}), each reads what the host's user can: "
                    f"{', '.join(names)}"
                )
        if refused:
            parts.append(
                f"agents refused ({sealing.problem}), they must run sealed: {', '.join(refused)}"
            )
        return "; ".join(parts), bool(off or unsealable or refused)


def sandbox_policy(settings: Settings) -> SandboxPolicy:
    """The host's :class:`SandboxPolicy` from its settings."""
    hidden = tuple(settings.hidden_paths())
    return SandboxPolicy(settings.sandbox, settings.sandbox_tmp_bytes, hidden)
