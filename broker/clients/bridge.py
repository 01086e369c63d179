"""Stdio <-> WebSocket bridge behind ``acp-broker connect ws://HOST:PORT/acp``.

Editors such as Zed launch an ACP agent as a subprocess and speak newline-delimited
JSON-RPC on its stdin/stdout. The bridge lets such an editor use the broker as its agent:
it holds one WebSocket connection to the broker at a time and relays messages both ways.

* Each non-blank stdin line becomes one text frame, with the trailing newline removed.
  Lines are parsed to follow the editor's requests and sessions (see :mod:`.resume`);
  what is not JSON is forwarded as it is (the broker answers it).
* Each text frame becomes one stdout line. A frame containing a line break is parsed and
  re-serialized compactly so that one message stays one line; a multi-line frame that is
  not valid JSON is dropped and reported on stderr. Binary and blank frames are ignored.
* When the connection drops (the node shuts down or restarts, a reset, a failed
  keepalive: :data:`.link.RECONNECT_CODES`), the bridge reconnects, to the same URL or the
  next of those given, and resumes where it was (:mod:`.reconnecting`): the editor sees
  a delay, stderr one line.

Exit codes returned by :func:`run_bridge` and :func:`main_connect`:

* ``0`` (:data:`EXIT_OK`): stdin reached EOF and the bridge closed the WebSocket (1000).
* ``1`` (:data:`EXIT_DISCONNECTED`): the server closed the connection for good (a code
  reconnecting cannot help), the broker stayed out of reach past the bound after a drop
  (``give_up_after``, 60 s by default), stdout broke, or stdin failed; stderr names the
  close code and reason or the local cause.
* ``2`` (:data:`EXIT_CONNECT_FAILED`): bad URL, first connection refused, handshake rejected
  (e.g. HTTP 401), unusable stdio or malformed ``--header``/``--token``; one stderr line.
* ``130`` (:data:`EXIT_INTERRUPTED`): interrupted by Ctrl-C (``main_connect`` only).
* ``143`` (:data:`EXIT_TERMINATED`): SIGTERM; the WebSocket is closed normally first
  (``main_connect`` only).

Every stderr line starts with ``acp-broker connect:``; stdout carries only ACP messages.
Expected failures never print a traceback.
"""

from __future__ import annotations

import asyncio
import os
import re
import selectors
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import BinaryIO, Final, Protocol, TextIO
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
    WebSocketException,
)

from .backoff import Backoff, UrlRing
from .output import one_line as _one_line
from .output import report as _report
from .reconnecting import ConnectFailed, Relay

__all__ = [
    "EXIT_CONNECT_FAILED",
    "EXIT_DISCONNECTED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "MAX_MESSAGE_BYTES",
    "ByteSink",
    "HeaderError",
    "build_headers",
    "main_connect",
    "run_bridge",
]

EXIT_OK: Final = 0
EXIT_DISCONNECTED: Final = 1
EXIT_CONNECT_FAILED: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_TERMINATED: Final = 143

MAX_MESSAGE_BYTES: Final = 50 * 1024 * 1024
"""Largest stdin line and largest incoming WebSocket message, in bytes (50 MiB)."""

OPEN_TIMEOUT_SECONDS: Final = 10.0
CLOSE_TIMEOUT_SECONDS: Final = 3.0
GIVE_UP_AFTER_SECONDS: Final = 60.0
"""How long the broker may stay out of reach after a drop before the bridge gives up."""

_HTTP_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FORBIDDEN_IN_VALUE: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_RESERVED_HEADERS: Final = frozenset(
    {"host", "upgrade", "connection", "sec-websocket-key", "sec-websocket-version"}
)
_BODY_SNIPPET_CHARS: Final = 200
_CHUNK_BYTES: Final = 64 * 1024


class ByteSink(Protocol):
    """Destination for editor-bound bytes; :class:`asyncio.StreamWriter` satisfies it."""

    def write(self, data: bytes) -> object:
        """Queue ``data`` for writing."""

    async def drain(self) -> None:
        """Wait until queued data has been handed to the OS; raise ``OSError`` if closed."""


class HeaderError(ValueError):
    """A ``--header`` or ``--token`` value cannot be sent as an HTTP header."""


class _FileSink:
    """Blocking :class:`ByteSink` for a stdout redirected to a regular file.

    Pipe transports refuse regular files; writes to them do not block for long.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def write(self, data: bytes) -> None:
        """Write ``data`` to the file's buffer."""
        self._stream.write(data)

    async def drain(self) -> None:
        """Flush the file's buffer to the OS."""
        self._stream.flush()


# --------------------------------------------------------------------------- CLI entry


def main_connect(
    url: str | Sequence[str],
    headers: list[str],
    token: str | None,
    give_up_after: float = GIVE_UP_AFTER_SECONDS,
) -> int:
    """Run the bridge on the process's stdin/stdout and return its exit code.

    Args:
        url: Broker endpoint, e.g. ``ws://127.0.0.1:8765/acp``, or several (tried in turn).
        headers: Extra handshake headers as ``"Name: value"`` strings.
        token: If given, sent as ``Authorization: Bearer <token>``.
        give_up_after: Seconds the broker may stay out of reach after a drop.

    Returns:
        An exit code as described in the module docstring.
    """
    try:
        handshake_headers = build_headers(headers, token)
    except HeaderError as exc:
        _report(str(exc))
        return EXIT_CONNECT_FAILED
    try:
        return asyncio.run(_run_until_terminated(url, handshake_headers, give_up_after))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


async def _run_until_terminated(
    url: str | Sequence[str], headers: Mapping[str, str], give_up_after: float
) -> int:
    """Run :func:`run_bridge` on process stdio; on SIGTERM close it and return 143."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = asyncio.Event()

    def on_sigterm() -> None:
        terminated.set()
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await run_bridge(url, headers=headers, give_up_after=give_up_after)
    except asyncio.CancelledError:
        if not terminated.is_set():
            raise
        return EXIT_TERMINATED
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def build_headers(lines: Iterable[str], token: str | None = None) -> dict[str, str]:
    """Turn ``"Name: value"`` strings and an optional bearer token into handshake headers.

    Raises:
        HeaderError: A line is not ``Name: value`` with an HTTP token as name, a value
            contains control characters, a name repeats (case-insensitively) or belongs
            to the WebSocket handshake itself (Host, Upgrade, ...), or the token is blank,
            contains whitespace, or clashes with an Authorization header.
    """
    headers: dict[str, str] = {}
    for line in lines:
        name, value = _parse_header(line)
        if name.lower() in (known.lower() for known in headers):
            raise HeaderError(f"header {name!r} given more than once")
        headers[name] = value
    if token is not None:
        if any(name.lower() == "authorization" for name in headers):
            raise HeaderError("--token and an 'Authorization' header cannot be combined")
        headers["Authorization"] = f"Bearer {_check_token(token)}"
    return headers


def _parse_header(line: str) -> tuple[str, str]:
    """Split one ``"Name: value"`` string; raise :class:`HeaderError` if malformed."""
    name, colon, value = line.partition(":")
    if not colon or not _HTTP_TOKEN.fullmatch(name):
        raise HeaderError(f"malformed header {line!r}: expected 'Name: value'")
    if name.lower() in _RESERVED_HEADERS:
        raise HeaderError(f"header {name!r} is set by the WebSocket handshake itself")
    value = value.strip(" \t")
    if _FORBIDDEN_IN_VALUE.search(value):
        raise HeaderError(f"malformed header {name!r}: value contains control characters")
    return name, value


def _check_token(token: str) -> str:
    """Return ``token`` if it can follow ``Bearer``; raise :class:`HeaderError` if not."""
    if not token or any(char.isspace() or not char.isprintable() for char in token):
        raise HeaderError("--token must be non-empty, without whitespace or control characters")
    return token


# --------------------------------------------------------------------------- bridge


async def run_bridge(
    url: str | Sequence[str],
    *,
    headers: Mapping[str, str] | None = None,
    stdin: asyncio.StreamReader | None = None,
    stdout: ByteSink | None = None,
    give_up_after: float = GIVE_UP_AFTER_SECONDS,
) -> int:
    """Relay newline-delimited JSON-RPC between stdio and the broker's WebSocket, and
    reconnect when the connection drops (see :mod:`.reconnecting`).

    Args:
        url: Broker endpoint, e.g. ``ws://127.0.0.1:8765/acp``, or several: the first one
            that answers is used, and the others are tried in turn after a drop.
        headers: Extra HTTP headers for the opening handshake.
        stdin: Source of editor messages; defaults to the process's stdin.
        stdout: Sink for broker messages; defaults to the process's stdout.
        give_up_after: Seconds the broker may stay out of reach after a drop.

    Returns:
        :data:`EXIT_OK`, :data:`EXIT_DISCONNECTED` or :data:`EXIT_CONNECT_FAILED`.
    """
    urls = [url] if isinstance(url, str) else list(url)
    try:
        ring = UrlRing(urls)
        backoff = Backoff(give_up_after=give_up_after)
    except ValueError as exc:
        _report(str(exc))
        return EXIT_CONNECT_FAILED
    try:
        async with _stdio(stdin, stdout) as (reader, sink):
            ws = await _connect_first(ring, headers)

            async def again(target: str) -> ClientConnection:
                try:
                    return await _connect(target, headers)
                except _StartupError as exc:
                    raise ConnectFailed(str(exc)) from exc

            relay = Relay(again, ring, backoff, reader, sink, _redact)
            try:
                return await relay.run(ws)
            finally:
                await ws.close()
    except _StartupError as exc:
        _report(str(exc))
        return EXIT_CONNECT_FAILED


async def _connect_first(ring: UrlRing, headers: Mapping[str, str] | None) -> ClientConnection:
    """The first connection: to the first URL that answers (the failure of the first URL
    is raised when none does)."""
    first: _StartupError | None = None
    for _ in ring.urls:
        try:
            return await _connect(ring.current, headers)
        except _StartupError as exc:
            first = first or exc
            ring.failed()
    assert first is not None
    raise first


class _StartupError(Exception):
    """The bridge could not start; the message is one line ready for stderr."""


async def _connect(url: str, headers: Mapping[str, str] | None) -> ClientConnection:
    """Open the WebSocket; raise :class:`_StartupError` naming URL and cause on failure."""
    try:
        return await connect(
            url,
            additional_headers=dict(headers or {}),
            max_size=MAX_MESSAGE_BYTES,
            open_timeout=OPEN_TIMEOUT_SECONDS,
            close_timeout=CLOSE_TIMEOUT_SECONDS,
        )
    except (WebSocketException, OSError, ValueError) as exc:
        cause = _describe_connect_error(exc)
        raise _StartupError(f"cannot connect to {_redact(url)}: {cause}") from exc


def _describe_connect_error(exc: Exception) -> str:
    """Explain a failure to open the WebSocket in a few words, on one line."""
    if isinstance(exc, InvalidURI):
        return f"invalid URL ({exc.msg})"
    if isinstance(exc, InvalidStatus):
        return _describe_rejection(exc)
    if isinstance(exc, TimeoutError):
        return "timed out during the opening handshake"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host ({exc.strerror})"
    if isinstance(exc, InvalidHandshake):
        return f"WebSocket handshake failed: {_with_cause(exc)}"
    return _with_cause(exc)


def _describe_rejection(exc: InvalidStatus) -> str:
    """Describe an HTTP response that refused the upgrade, with a snippet of its body."""
    response = exc.response
    text = f"handshake rejected with HTTP {response.status_code} {response.reason_phrase}"
    body = bytes(response.body or b"").decode("utf-8", "replace").strip()
    if body:
        text += f" ({_one_line(body)[:_BODY_SNIPPET_CHARS]})"
    return text


def _with_cause(exc: BaseException) -> str:
    """Render ``exc`` and its direct cause, if any, as one line."""
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None:
        text += f": {cause or type(cause).__name__}"
    return _one_line(text)


# --------------------------------------------------------------------------- stdio


@asynccontextmanager
async def _stdio(
    stdin: asyncio.StreamReader | None, stdout: ByteSink | None
) -> AsyncIterator[tuple[asyncio.StreamReader, ByteSink]]:
    """Yield the given streams, opening the process's stdin/stdout for missing ones.

    Whatever is opened here is closed on exit; streams passed in are left open.
    """
    async with AsyncExitStack() as stack:
        if stdin is None:
            stdin = await _open_stdin(stack)
        if stdout is None:
            stdout = await _open_stdout(stack)
        yield stdin, stdout


async def _open_stdin(stack: AsyncExitStack) -> asyncio.StreamReader:
    """Return a reader of ``sys.stdin`` with a :data:`MAX_MESSAGE_BYTES` line limit.

    Pipes, sockets and terminals are read by the event loop. Inputs the loop cannot
    poll (regular files, ``/dev/null``) are read in 64 KiB chunks by a worker thread.
    """
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
    if _pollable(sys.stdin):
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
        )
        stack.callback(transport.close)
    else:
        feeder = asyncio.create_task(_feed_from_fd(reader, sys.stdin.fileno()))
        stack.push_async_callback(_cancel, feeder)
    return reader


async def _open_stdout(stack: AsyncExitStack) -> ByteSink:
    """Return a sink for ``sys.stdout``: a pipe writer, or a file writer for regular files."""
    if stat.S_ISREG(_file_mode(sys.stdout, "stdout")):
        return _FileSink(sys.stdout.buffer)
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, sys.stdout
        )
    except (ValueError, OSError) as exc:
        raise _StartupError(f"cannot write to stdout ({exc})") from exc
    stack.callback(transport.close)
    return asyncio.StreamWriter(transport, protocol, None, loop)


def _pollable(stream: TextIO) -> bool:
    """Tell whether the event loop can watch ``stream`` for readability."""
    mode = _file_mode(stream, "stdin")
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return True
    if not stat.S_ISCHR(mode):
        return False
    with selectors.DefaultSelector() as selector:
        try:
            selector.register(stream.fileno(), selectors.EVENT_READ)
        except OSError:
            return False
    return True


def _file_mode(stream: TextIO | None, name: str) -> int:
    """Return the ``st_mode`` of a standard stream; raise :class:`_StartupError` if closed."""
    if stream is None:
        raise _StartupError(f"{name} is closed")
    try:
        return os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError) as exc:
        raise _StartupError(f"{name} is not usable ({exc})") from exc


async def _feed_from_fd(reader: asyncio.StreamReader, fd: int) -> None:
    """Copy ``fd`` into ``reader`` chunk by chunk in a worker thread, then signal EOF."""
    try:
        while chunk := await asyncio.to_thread(os.read, fd, _CHUNK_BYTES):
            reader.feed_data(chunk)
    except OSError as exc:
        reader.set_exception(exc)
    else:
        reader.feed_eof()


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it to finish."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# --------------------------------------------------------------------------- helpers


def _redact(url: str) -> str:
    """Return ``url`` with any ``user:password@`` part masked, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))
