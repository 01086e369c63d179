"""``/acp`` on the WebSocket port answers what is not a WebSocket upgrade with an HTTP error
naming the URLs; ``/acp`` on the HTTP port serves Streamable HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from broker.serve import Broker

INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})


async def _raw_http(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def _ask(port: int, method: str, path: str, body: bytes) -> tuple[str, str]:
    """The head and text of what ``port`` answers an HTTP request with ``body``."""
    request = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n\r\n"
    ).encode() + body
    head, _, text = (await _raw_http(port, request)).decode().partition("\r\n\r\n")
    return head, text


@pytest.mark.parametrize("with_body", [True, False])
async def test_a_post_to_acp_on_the_websocket_port_gets_405_naming_the_url(
    broker: Broker, with_body: bool
) -> None:
    body = INITIALIZE.encode() if with_body else b""
    head, text = await _ask(broker.port, "POST", "/acp", body)
    assert head.startswith("HTTP/1.1 405 Method Not Allowed"), head
    assert "Allow: GET" in head
    assert f"ws://127.0.0.1:{broker.port}/acp" in text and "WebSocket" in text


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_other_paths_on_the_websocket_port_get_404_naming_the_http_port(
    broker: Broker, method: str
) -> None:
    # A request with a body is refused by the handshake parser before process_request;
    # it must still get the same answer as a GET, not a closed connection.
    head, text = await _ask(broker.port, method, "/v1/sessions", b'{"cwd": "/tmp"}')
    assert head.startswith("HTTP/1.1 404"), head
    assert f"http://127.0.0.1:{broker.http_port}/v1/sessions" in text


async def test_acp_on_the_http_port_serves_streamable_http(broker: Broker) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": 1},
    }
    head, text = await _ask(broker.http_port, "POST", "/acp", json.dumps(initialize).encode())
    assert head.startswith("HTTP/1.1 200"), head
    assert "acp-connection-id" in head.lower()
    assert json.loads(text)["id"] == 0


async def test_a_websocket_upgrade_on_the_http_port_names_the_websocket_url(
    broker: Broker,
) -> None:
    request = (
        f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1:{broker.http_port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    head, _, text = (await _raw_http(broker.http_port, request)).decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 400"), head
    assert f"ws://127.0.0.1:{broker.port}/acp" in text


async def test_the_websocket_upgrade_on_acp_still_works(url: str) -> None:
    async with websockets.connect(url) as ws:
        await ws.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {"protocolVersion": 1},
                }
            )
        )
        assert json.loads(await ws.recv())["result"]["protocolVersion"] == 1
