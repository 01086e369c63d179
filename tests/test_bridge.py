"""Tests for ``broker.clients.bridge``: the stdio <-> WebSocket bridge of ``acp-broker connect``.

A stub ACP endpoint runs in-process on 127.0.0.1 with an OS-chosen port; the bridge runs as
a real subprocess (or in-process where stdio has to be injected).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any, cast

import pytest
from acp import PROTOCOL_VERSION, Client, RequestError, spawn_agent_process
from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from broker.clients.bridge import HeaderError, build_headers, main_connect, run_bridge

ROOT = Path(__file__).resolve().parents[1]
BRIDGE_CODE = (
    "import sys; from broker.clients.bridge import main_connect; "
    "sys.exit(main_connect(sys.argv[1], [], None))"
)
BRIDGE_CODE_GIVING_UP = (
    "import sys; from broker.clients.bridge import main_connect; "
    "sys.exit(main_connect(sys.argv[1], [], None, float(sys.argv[2])))"
)
TIMEOUT = 5.0
# A trimmed environment: no proxy variables, so the bridge dials the stub directly.
ENV = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}

Handler = Callable[[ServerConnection], Awaitable[None]]
RequestHook = Callable[[ServerConnection, Request], Response | None]


# --------------------------------------------------------------------------- stubs


class StubAgent:
    """Minimal ACP endpoint: answers ``initialize``, rejects other requests with -32601."""

    def __init__(self, *, pretty: bool = False) -> None:
        self.pretty = pretty
        self.connected = asyncio.Event()
        self.closed = asyncio.Event()
        self.close_code: int | None = None

    async def __call__(self, ws: ServerConnection) -> None:
        """Serve one connection until the client closes it."""
        self.connected.set()
        try:
            async for raw in ws:
                reply = self.reply(json.loads(raw))
                if reply is not None:
                    await ws.send(json.dumps(reply, indent=2 if self.pretty else None))
        except ConnectionClosed:
            pass
        finally:
            received = ws.protocol.close_rcvd
            self.close_code = None if received is None else received.code
            self.closed.set()

    @staticmethod
    def reply(message: dict[str, Any]) -> dict[str, Any] | None:
        """Return the response to a request, or ``None`` for a notification."""
        if "id" not in message or "method" not in message:
            return None
        if message["method"] == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {}}
            return {"jsonrpc": "2.0", "id": message["id"], "result": result}
        error = {"code": -32601, "message": f"Method not found: {message['method']}"}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}


class NullClient:
    """ACP client side that implements nothing; the stub never calls the client."""


class ListSink:
    """In-memory :class:`broker.clients.bridge.ByteSink` that signals each written line."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.wrote = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.lines.append(data)
        self.wrote.set()

    async def drain(self) -> None:
        return None

    async def wait_for_lines(self, count: int) -> None:
        """Wait until at least ``count`` lines have been written."""
        while len(self.lines) < count:
            self.wrote.clear()
            await self.wrote.wait()


@contextlib.asynccontextmanager
async def stub_server(
    handler: Handler, process_request: RequestHook | None = None
) -> AsyncIterator[str]:
    """Serve ``handler`` on 127.0.0.1 with an OS-chosen port; yield the ``/acp`` URL."""
    async with serve(handler, "127.0.0.1", 0, process_request=process_request) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/acp"


@contextlib.asynccontextmanager
async def bridge_process(
    url: str, *, give_up_after: float = 60.0
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run the bridge subprocess with piped stdio; kill it if a test leaves it running."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        BRIDGE_CODE_GIVING_UP,
        url,
        str(give_up_after),
        cwd=ROOT,
        env=ENV,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def finish(process: asyncio.subprocess.Process) -> tuple[int, str]:
    """Wait (bounded) for the bridge to exit without touching its stdin.

    Returns:
        The exit code and everything the bridge wrote to stderr.
    """
    assert process.stdout is not None and process.stderr is not None
    async with asyncio.timeout(TIMEOUT):
        _, stderr = await asyncio.gather(process.stdout.read(), process.stderr.read())
        code = await process.wait()
    return code, stderr.decode()


def unused_port() -> int:
    """Return a loopback port that nothing listens on (bound briefly, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --------------------------------------------------------------------------- subprocess


async def test_initialize_through_bridge() -> None:
    agent = StubAgent(pretty=True)
    async with stub_server(agent) as url, asyncio.timeout(TIMEOUT):
        async with spawn_agent_process(
            cast(Client, NullClient()), sys.executable, "-c", BRIDGE_CODE, url, cwd=ROOT, env=ENV
        ) as (conn, process):
            response = await conn.initialize(protocol_version=PROTOCOL_VERSION)
            assert response.protocol_version == 1
            with pytest.raises(RequestError) as excinfo:
                await conn.new_session(cwd=str(ROOT), mcp_servers=[])
            assert excinfo.value.code == -32601
        assert process.returncode == 0
        await agent.closed.wait()
    assert agent.close_code == 1000


async def test_stdin_eof_closes_normally_and_exits_zero() -> None:
    agent = StubAgent()
    async with stub_server(agent) as url, bridge_process(url) as process:
        async with asyncio.timeout(TIMEOUT):
            await agent.connected.wait()
        assert process.stdin is not None
        process.stdin.close()
        code, stderr = await finish(process)
        async with asyncio.timeout(TIMEOUT):
            await agent.closed.wait()
    assert code == 0, stderr
    assert stderr == ""
    assert agent.close_code == 1000


async def test_server_close_for_good_exits_one_and_names_code() -> None:
    async def refuse(ws: ServerConnection) -> None:
        await ws.close(1008, "not for you")

    async with stub_server(refuse) as url, bridge_process(url) as process:
        code, stderr = await finish(process)
    assert code == 1
    assert stderr.count("\n") == 1
    assert "code 1008" in stderr
    assert "not for you" in stderr
    assert "Traceback" not in stderr


async def test_a_node_that_keeps_restarting_is_given_up_past_the_bound() -> None:
    connections = 0

    async def restart(ws: ServerConnection) -> None:
        nonlocal connections
        connections += 1
        await ws.close(1012, "restarting")

    async with stub_server(restart) as url, bridge_process(url, give_up_after=0.5) as process:
        code, stderr = await finish(process)
    assert code == 1
    assert stderr.count("\n") == 1
    assert "gave up" in stderr and "code 1012" in stderr and "restarting" in stderr
    assert connections >= 2  # it did try again
    assert "Traceback" not in stderr


async def test_an_editor_that_leaves_during_an_outage_ends_the_bridge_at_once() -> None:
    connections = 0
    tried_again = asyncio.Event()

    async def restart(ws: ServerConnection) -> None:
        nonlocal connections
        connections += 1
        if connections >= 2:
            tried_again.set()
        await ws.close(1012, "restarting")

    async with stub_server(restart) as url, bridge_process(url, give_up_after=60) as process:
        async with asyncio.timeout(TIMEOUT):
            await tried_again.wait()
        assert process.stdin is not None
        process.stdin.close()
        code, stderr = await finish(process)  # within TIMEOUT, far under the 60 s bound
    assert code == 0, stderr


async def test_closed_port_exits_two_with_one_line() -> None:
    url = f"ws://127.0.0.1:{unused_port()}/acp"
    async with bridge_process(url) as process:
        code, stderr = await finish(process)
    assert code == 2
    assert stderr.count("\n") == 1
    assert url in stderr
    assert "connection refused" in stderr
    assert "Traceback" not in stderr


async def test_http_401_exits_two_with_one_line() -> None:
    def reject(ws: ServerConnection, request: Request) -> Response:
        return ws.respond(HTTPStatus.UNAUTHORIZED, "missing or invalid token\n")

    async with stub_server(StubAgent(), reject) as url, bridge_process(url) as process:
        code, stderr = await finish(process)
    assert code == 2
    assert stderr.count("\n") == 1
    assert url in stderr
    assert "401" in stderr
    assert "Traceback" not in stderr


async def test_sigterm_closes_normally_and_exits_143() -> None:
    agent = StubAgent()
    async with stub_server(agent) as url, bridge_process(url) as process:
        assert process.stdin is not None and process.stdout is not None
        async with asyncio.timeout(TIMEOUT):
            # A round trip proves the bridge is relaying, not still connecting.
            process.stdin.write(b'{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}\n')
            reply = json.loads(await process.stdout.readline())
        assert reply["id"] == 7
        process.send_signal(signal.SIGTERM)
        code, stderr = await finish(process)
        async with asyncio.timeout(TIMEOUT):
            await agent.closed.wait()
    assert code == 143, stderr
    assert agent.close_code == 1000


# --------------------------------------------------------------------------- in-process


async def test_frames_become_single_lines_and_headers_are_sent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen_headers: list[str | None] = []

    async def chatty(ws: ServerConnection) -> None:
        seen_headers.append(ws.request.headers.get("Authorization") if ws.request else None)
        async for raw in ws:
            await ws.send(json.dumps(json.loads(raw), indent=2))
            await ws.send(b"binary frames are ignored")
            await ws.send("{not\njson")
            await ws.send("  ")
            await ws.send('{"last":true}')

    stdin = asyncio.StreamReader()
    stdin.feed_data(b'{"jsonrpc": "2.0", "method": "x", "params": {"s": "a\\nb"}}\r\n\n')
    sink = ListSink()
    async with stub_server(chatty) as url, asyncio.timeout(TIMEOUT):
        bridge = asyncio.create_task(
            run_bridge(url, headers={"Authorization": "Bearer t0k"}, stdin=stdin, stdout=sink)
        )
        await sink.wait_for_lines(2)
        stdin.feed_eof()
        assert await bridge == 0
    assert sink.lines == [
        b'{"jsonrpc":"2.0","method":"x","params":{"s":"a\\nb"}}\n',
        b'{"last":true}\n',
    ]
    assert seen_headers == ["Bearer t0k"]
    assert "dropped a multi-line frame" in capsys.readouterr().err


async def test_of_several_urls_the_first_that_answers_is_used() -> None:
    stdin = asyncio.StreamReader()
    stdin.feed_data(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n')
    sink = ListSink()
    refused = f"ws://127.0.0.1:{unused_port()}/acp"
    async with stub_server(StubAgent()) as url, asyncio.timeout(TIMEOUT):
        bridge = asyncio.create_task(run_bridge([refused, url], stdin=stdin, stdout=sink))
        await sink.wait_for_lines(1)
        stdin.feed_eof()
        assert await bridge == 0
    assert json.loads(sink.lines[0])["id"] == 1


def test_build_headers() -> None:
    headers = build_headers(["X-Trace: abc ", "X-Empty:"], token="s3cret")
    assert headers == {"X-Trace": "abc", "X-Empty": "", "Authorization": "Bearer s3cret"}


@pytest.mark.parametrize(
    ("lines", "token"),
    [
        (["no colon"], None),
        (["Bad Name: v"], None),
        ([": v"], None),
        (["X-A: 1", "x-a: 2"], None),
        (["X-A: a\rb"], None),
        (["Upgrade: h2c"], None),
        (["Authorization: Basic x"], "t"),
        ([], "has space"),
        ([], ""),
    ],
)
def test_build_headers_rejects(lines: list[str], token: str | None) -> None:
    with pytest.raises(HeaderError):
        build_headers(lines, token)


def test_main_connect_reports_malformed_header(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_connect("ws://127.0.0.1:1/acp", ["oops"], None) == 2
    err = capsys.readouterr().err
    assert err == "acp-broker connect: malformed header 'oops': expected 'Name: value'\n"
