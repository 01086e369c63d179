"""A lean WebSocket client for load generation (RFC 6455, the parts a load client needs).

One client process holds thousands of connections; the per-message cost on the client side
is what caps the delivered rate on a 2-core machine, so the client does as little as it can:
it parses the frame header, hands the payload bytes to a callback, answers pings, and
masks what it sends with a zero key (legal, and free). Every system under test (the
broker, python-socketio, the bare relay) is driven by this same client.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from typing import cast

OnText = Callable[[bytes], None]


def _frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    return head + b"\x00\x00\x00\x00" + payload  # mask key 0: the payload goes as is


class WsClient(asyncio.Protocol):
    """One connection. ``on_text`` gets every text payload (bytes) in order."""

    def __init__(self, host: str, path: str, on_text: OnText | None = None) -> None:
        self.host = host
        self.path = path
        self.on_text = on_text or (lambda data: None)
        self.transport: asyncio.Transport | None = None
        self.upgraded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buf = bytearray()
        self._fragments: list[bytes] = []
        self._is_upgraded = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no subclass of asyncio.Transport, only alike
        self.transport = cast(asyncio.Transport, transport)
        key = base64.b64encode(os.urandom(16)).decode()
        self.transport.write(
            (
                f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if not self._is_upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(buf[:end]).split(b"\r\n", 1)[0]
            del buf[: end + 4]
            if b" 101 " not in status + b" ":
                if not self.upgraded.done():
                    self.upgraded.set_exception(ConnectionError(status.decode(errors="replace")))
                assert self.transport is not None
                self.transport.close()
                return
            self._is_upgraded = True
            self.upgraded.set_result(None)
        pos = 0
        size = len(buf)
        on_text = self.on_text
        while size - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            n = b1 & 0x7F
            head = 2
            if n == 126:
                if size - pos < 4:
                    break
                n = int.from_bytes(buf[pos + 2 : pos + 4], "big")
                head = 4
            elif n == 127:
                if size - pos < 10:
                    break
                n = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                head = 10
            if size - pos < head + n:
                break
            payload = bytes(buf[pos + head : pos + head + n])
            pos += head + n
            opcode = b0 & 0x0F
            if opcode == 1 or opcode == 0:
                if b0 & 0x80:
                    if self._fragments:
                        self._fragments.append(payload)
                        payload, self._fragments = b"".join(self._fragments), []
                    on_text(payload)
                else:
                    self._fragments.append(payload)
            elif opcode == 9:
                self._write(10, payload)
            elif opcode == 8:
                self._write(8, payload[:2])
                assert self.transport is not None
                self.transport.close()
        if pos:
            del buf[:pos]

    def _write(self, opcode: int, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_frame(opcode, payload))

    def send_text(self, text: str | bytes) -> None:
        self._write(1, text.encode() if isinstance(text, str) else text)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(exc or ConnectionError("closed before the upgrade"))
        if not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(
    url: str, on_text: OnText | None = None, timeout: float = 30.0, local_host: str | None = None
) -> WsClient:
    """Open ``ws://host:port/path`` and finish the upgrade; ``local_host``: the source
    address to connect from (each loopback address has its own ephemeral ports, so that
    clients from several of them can open more connections to one server than one can)."""
    assert url.startswith("ws://")
    hostport, _, path = url[5:].partition("/")
    host, _, port = hostport.partition(":")
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(
        loop.create_connection(
            lambda: WsClient(hostport, "/" + path, on_text),
            host,
            int(port),
            local_addr=(local_host, 0) if local_host else None,
        ),
        timeout,
    )
    await asyncio.wait_for(client.upgraded, timeout)
    return client
