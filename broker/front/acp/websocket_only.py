"""What ``/acp`` on the WebSocket port answers to anything but a WebSocket upgrade: an HTTP
error naming the URLs.

ACP's remote transport RFD puts two profiles on one ``/acp`` endpoint: Streamable HTTP
(POST a message, GET a stream) and a WebSocket upgrade. The broker serves the WebSocket
profile on its ACP port (the ``websockets`` server) and Streamable HTTP on its HTTP port's
``/acp`` (``broker/front/streamable``), so a POST to ``/acp`` on the WebSocket port gets
``405 Method Not Allowed`` (``Allow: GET``) with a body that names both URLs.

A POST that carries a body never reaches ``process_request``: the ``websockets``
handshake parser refuses request bodies and closes the connection without a word.
:class:`WebSocketOnlyConnection` looks at the request line before that parser does
(the request line and headers arrive in the first segment: clients write them at once),
and answers such a request to any other path as ``process_request`` answers a GET there:
``404`` naming the HTTP port, where REST, OpenAPI and MCP live.
"""

from __future__ import annotations

import http
from collections.abc import Callable
from typing import Any

from ...config import Settings
from .keepalive import PingedConnection

_METHODS = (b"POST", b"PUT", b"PATCH", b"DELETE", b"HEAD", b"OPTIONS")


def websocket_url(settings: Settings, port: int, host_header: str | None = None) -> str:
    """The ACP WebSocket URL of this node, on the host the client addressed when it said."""
    host = settings.host
    if host_header:
        # "name:port", "[v6]:port" or "name": keep the name, use the WebSocket port.
        name = host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header
        if host_header.startswith("["):
            name = host_header.split("]", 1)[0] + "]"
        host = name
    elif ":" in host:
        host = f"[{host}]"
    scheme = "wss" if settings.tls_cert else "ws"
    return f"{scheme}://{host}:{port}{settings.path}"


def refusal(url: str, http_base: str) -> str:
    """The text of the refusal: what to do instead."""
    return (
        f"This port serves ACP over WebSocket: open a WebSocket to {url} (GET with Upgrade:"
        f" websocket) and send initialize first. ACP's Streamable HTTP transport (POST, GET"
        f" and DELETE) is served on the HTTP port: {http_base}{_acp_path(url)}\n"
    )


def _acp_path(url: str) -> str:
    return "/" + url.split("://", 1)[-1].split("/", 1)[-1]


def elsewhere(settings: Settings, path: str, http_base: str) -> str:
    """The text of the WebSocket port's 404 for ``path``: where it is served instead."""
    return (
        f"{path} is not served on the WebSocket port (ACP at {settings.path});"
        f" REST, OpenAPI and MCP are on the HTTP port: {http_base}{path}\n"
    )


class WebSocketOnlyConnection(PingedConnection):
    """A WebSocket port connection that answers a non-GET request with an HTTP error.

    ``/acp`` gets ``405`` naming the WebSocket URL; any other path ``404`` naming the
    HTTP port (``http_base`` gives its base URL when the request comes). Its keepalive
    pings come from the node's :class:`~.keepalive.Keepalive`.
    """

    settings: Settings
    http_base: Callable[[], str]

    def before_handshake(self, data: bytes) -> bytes | None:
        method, _, rest = data.partition(b" ")
        if method not in _METHODS:
            return None  # GET (the handshake), or not HTTP: the handshake parser decides
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0].decode("ascii", "replace")
        if path != self.settings.path:
            text = elsewhere(self.settings, path, self.http_base())
            return _answer(http.HTTPStatus.NOT_FOUND, text, "")
        port = int(self.transport.get_extra_info("sockname")[1])
        text = refusal(websocket_url(self.settings, port, _host_header(data)), self.http_base())
        return _answer(http.HTTPStatus.METHOD_NOT_ALLOWED, text, "Allow: GET\r\n")


def connection_class(settings: Settings, http_base: Callable[[], str]) -> Any:
    """A :class:`WebSocketOnlyConnection` class bound to ``settings`` (for ``serve``)."""
    fields = {"settings": settings, "http_base": staticmethod(http_base)}
    return type("AcpConnection", (WebSocketOnlyConnection,), fields)


def _answer(status: http.HTTPStatus, text: str, extra_headers: str) -> bytes:
    body = text.encode()
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n{extra_headers}"
        f"Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _host_header(data: bytes) -> str | None:
    for line in data.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            return value.strip().decode("ascii", "replace") or None
        if not line:
            break
    return None
