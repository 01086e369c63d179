"""An ACP agent that does what a hostile tenant would ask of a real one, for the sandbox tests.

Run it as ``python tests/agents/hostile_agent.py``. A prompt whose text is a JSON object
(``config``, ``other_cwd``, ``host_pid``, ``signal``, ``tmp_bytes``, ``redis``: the address
of the broker's Redis, ``host:port``) makes it try, in turn: read ``/proc/$PPID/environ`` and
``/proc/$PPID/cmdline``, list ``/proc`` (and read every command line there), read the
broker's configuration file, read and write a file in another tenant's working directory,
talk to Redis with any ``redis://`` URL it was handed (``urls``) or found on the way (and,
without one, at the address it was told), send ``signal`` to the agent host, fill ``/tmp``
up to ``tmp_bytes``.
It answers with one ``agent_message_chunk``: a JSON object, one entry per attempt,
``{"ok": whether it worked, "data": what it got}``. Any other prompt is echoed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import tempfile
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

from acp import PROTOCOL_VERSION, run_agent, update_agent_message_text
from acp.interfaces import Agent, Client
from acp.schema import (
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    TextContentBlock,
)

_MIB = 1024 * 1024
_URL = re.compile(r"rediss?://[^\s\"'\x00]+")


def _read(path: str) -> str:
    with open(path, "rb") as file:
        return file.read(_MIB).replace(b"\x00", b" ").decode(errors="replace")


def _attempt(action: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": True, "data": action()}
    except Exception as exc:
        return {"ok": False, "data": f"{type(exc).__name__}: {exc}"}


def _list_proc() -> dict[str, str]:
    lines = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                lines[name] = _read(f"/proc/{name}/cmdline")
            except OSError:
                lines[name] = ""
    return lines


def _write_other(directory: str) -> str:
    path = os.path.join(directory, "written-by-another-tenant.txt")
    with open(path, "w") as file:
        file.write("pwned")
    return path


def _ping(url: str | None, address: str) -> str:
    """PING the Redis at ``url`` (its password sent first) or at ``address`` without one."""
    if url is not None:
        parts = urlsplit(url)
        host, port, password = parts.hostname or "", parts.port or 6379, parts.password
    else:
        host, _, port_text = address.rpartition(":")
        port, password = int(port_text), None
    with socket.create_connection((host, port), timeout=3) as sock:
        if password:
            sock.sendall(f"AUTH {password}\r\n".encode())
            sock.recv(1024)
        sock.sendall(b"PING\r\n")
        answer = sock.recv(1024).decode(errors="replace").strip()
    if answer != "+PONG":
        raise PermissionError(answer)
    return answer


def _redis(found: Sequence[str], address: str) -> str:
    errors = []
    for url in [*found, None]:
        try:
            return f"{_ping(url, address)} via {'a found URL' if url else address}"
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    raise ConnectionError("; ".join(errors))


def _fill_tmp(limit: int) -> int:
    """Write up to ``limit`` bytes into ``/tmp`` (then remove them); fails if it cannot."""
    path = os.path.join(tempfile.gettempdir(), f"fill-{uuid.uuid4().hex}")
    written = 0
    try:
        with open(path, "wb") as file:
            while written < limit:
                file.write(b"\0" * _MIB)
                file.flush()
                written += _MIB
    except OSError as exc:
        raise OSError(f"{exc.strerror} after {written} bytes") from None
    finally:
        if os.path.exists(path):
            os.remove(path)
    return written


def probe(orders: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every attempt, in turn (the signal last but one: it may end the host)."""
    parent = os.getppid()
    other = str(orders["other_cwd"])
    report = {
        "parent_environ": _attempt(lambda: _read(f"/proc/{parent}/environ")),
        "parent_cmdline": _attempt(lambda: _read(f"/proc/{parent}/cmdline")),
        "proc": _attempt(_list_proc),
        "config": _attempt(lambda: _read(str(orders["config"]))),
        "other_cwd_read": _attempt(lambda: _read(os.path.join(other, "secret.txt"))),
        "other_cwd_write": _attempt(lambda: _write_other(other)),
    }
    found = [*orders.get("urls", []), *_URL.findall(json.dumps(report))]
    report["redis"] = _attempt(lambda: _redis(found, str(orders["redis"])))
    report["signal"] = _attempt(lambda: os.kill(int(orders["host_pid"]), int(orders["signal"])))
    report["fill_tmp"] = _attempt(lambda: _fill_tmp(int(orders["tmp_bytes"])))
    return report


class HostileAgent:
    """initialize, session/new and session/prompt; a JSON prompt runs :func:`probe`."""

    _conn: Client

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(load_session=False),
            agent_info=Implementation(name="hostile-test-agent", version="0.1.0"),
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=f"hostile_{uuid.uuid4().hex}")

    async def prompt(self, session_id: str, prompt: Sequence[Any], **kwargs: Any) -> PromptResponse:
        text = "\n".join(block.text for block in prompt if isinstance(block, TextContentBlock))
        if text.startswith("{"):
            text = json.dumps(await asyncio.to_thread(probe, json.loads(text)))
        await self._conn.session_update(session_id, update_agent_message_text(text))
        return PromptResponse(stop_reason="end_turn")


if __name__ == "__main__":
    asyncio.run(run_agent(cast(Agent, HostileAgent())))
