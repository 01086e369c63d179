"""The web console: a page at ``/`` of the HTTP port, its static files under ``/console/``,
and each session's live view at ``/sessions/ID`` (the page, opened on that session).

The page is plain HTML, CSS and ES modules shipped in the package (``broker/console/``,
with Markdown and sanitizing from vendored ``marked`` and ``DOMPurify``); it talks ACP v2
over the same ``/acp`` WebSocket as every other client. Where that WebSocket is, the node
writes into the page (``<meta name="acp-broker-ws">``), per request:

- the ``console_ws_url`` setting when it is set;
- the same origin's ``path`` (``/acp``) when the request came through a proxy (it carries
  ``Forwarded`` or ``X-Forwarded-*``): nginx and the Ingress send ``/acp`` to the
  WebSocket port and everything else to the HTTP port, so the page has one origin;
- else this node's WebSocket port on the host the browser asked for
  (``//HOST:PORT/acp``; the page picks ``ws:`` or ``wss:`` after its own scheme).

Every page goes out with a strict Content-Security-Policy: scripts and styles from this
origin only, no inline code, images from this origin or ``data:``, connections to this
origin and the WebSocket, no frames, forms or plugins. Agent output is sanitized before it
is shown; the policy is the second fence.
"""

from __future__ import annotations

import hashlib
import html
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...config import Settings
from ...store.names import is_session_id

LIVE_VIEW_PATH = "/sessions/"
"""Where a session's live view is: ``/sessions/ID`` (the console, on that session)."""

ASSETS = Path(__file__).resolve().parents[2] / "console"
"""The console's files, shipped as package data."""
ASSETS_PATH = "/console"
_PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto")
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def websocket_url(settings: Settings, headers: dict[str, str], ws_port: int) -> str:
    """Where the page served for a request with ``headers`` opens the ACP WebSocket.

    A path or a scheme-relative URL, which the page resolves against its own address.
    """
    if settings.console_ws_url:
        return settings.console_ws_url
    if any(name in headers for name in _PROXY_HEADERS):
        return settings.path
    host = _hostname(headers.get("host", "")) or settings.host
    return f"//{host}:{ws_port}{settings.path}"


def _hostname(host_header: str) -> str:
    """The host name of a ``Host`` header, without its port (IPv6 keeps its brackets)."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if ":" in host_header else host_header


def content_security_policy(ws_url: str) -> str:
    """The page's policy; ``connect-src`` names the WebSocket's origin when it is another."""
    connect = ["'self'"]
    parts = urlsplit(ws_url)
    if parts.netloc:
        if parts.scheme:
            connect.append(f"{parts.scheme}://{parts.netloc}")
        else:
            connect += [f"ws://{parts.netloc}", f"wss://{parts.netloc}"]
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self' data:",
            "font-src 'self'",
            f"connect-src {' '.join(connect)}",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
            "object-src 'none'",
        ]
    )


def same_origin_console(origin: str, host_header: str | None, http_port: int) -> bool:
    """Whether a WebSocket upgrade's ``Origin`` is this deployment's own console.

    True when the origin is the origin the request was sent to (one origin behind a load
    balancer), or the same host on this node's HTTP port (the page straight from a node).
    A browser sets ``Origin`` itself, so a page elsewhere cannot claim either.
    """
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or not host_header:
        return False
    if parts.netloc.lower() == host_header.lower():
        return True
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    return port == http_port and _hostname(parts.netloc).lower() == _hostname(host_header).lower()


@dataclass(frozen=True, slots=True)
class _Asset:
    body: bytes
    media_type: str
    etag: str


def _read_assets(root: Path) -> dict[str, _Asset]:
    """Every file the console ships (a few dozen KB), by its path under ``/console/``.

    Read once and served from memory: a page loads its modules in a cascade of round
    trips, and Starlette's ``StaticFiles`` stats and reads each file in a worker thread
    per request, which on a busy node made each module wait 100-200 ms.
    """
    assets: dict[str, _Asset] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name == "index.html":
            continue
        body = path.read_bytes()
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix in (".js", ".mjs"):
            media_type = "text/javascript"  # module scripts need a JavaScript type
        elif ".LICENSE" in path.name:
            media_type = "text/plain"
        if media_type.startswith("text/"):
            media_type += "; charset=utf-8"
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        assets[path.relative_to(root).as_posix()] = _Asset(body, media_type, etag)
    return assets


async def live_view(request: Request) -> Response:
    """A session's live view URL (``/sessions/ID``, handed out by the session tools): the
    console, opened on that session (its ``#session=`` link: the page's files are
    addressed relative to ``/``, so the page is not served at this path itself)."""
    session_id = request.path_params["id"]
    if not is_session_id(session_id):
        return Response("not a session id\n", 404, media_type="text/plain")
    location = f"../#session={quote(session_id)}"
    return Response(status_code=303, headers={"Location": location, **_SECURITY_HEADERS})


class Console:
    """The console's routes for the HTTP port's app.

    ``ws_port`` tells the port of the node's WebSocket listener (known once it is bound);
    ``auth_required`` whether the page must ask for a token before it connects.
    """

    def __init__(self, settings: Settings, ws_port: Callable[[], int], auth_required: bool) -> None:
        self.settings = settings
        self.ws_port = ws_port
        self.auth_required = auth_required
        self._template = (ASSETS / "index.html").read_text(encoding="utf-8")
        self._assets = _read_assets(ASSETS)

    def routes(self) -> list[BaseRoute]:
        """``/`` (the page) and ``/console/…`` (its modules, styles, vendored libraries)."""
        return [
            Route("/", self.page, methods=["GET", "HEAD"]),
            Route(LIVE_VIEW_PATH + "{id}", live_view, methods=["GET", "HEAD"]),
            Route(ASSETS_PATH + "/{path:path}", self.asset, methods=["GET", "HEAD"]),
        ]

    async def asset(self, request: Request) -> Response:
        """One of the console's files (revalidated by ETag on each load: a new broker may
        ship new files); anything else under ``/console/`` is 404."""
        asset = self._assets.get(request.path_params["path"])
        if asset is None:
            return Response("not found\n", 404, media_type="text/plain")
        headers = {"ETag": asset.etag, "Cache-Control": "no-cache", **_SECURITY_HEADERS}
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers=headers)
        return Response(asset.body, 200, headers=headers, media_type=asset.media_type)

    async def page(self, request: Request) -> Response:
        """The console page, with the WebSocket URL and whether to sign in filled in."""
        ws_url = websocket_url(self.settings, dict(request.headers), self.ws_port())
        body = self._template.replace("__ACP_WS_URL__", html.escape(ws_url, quote=True)).replace(
            "__ACP_AUTH__", "on" if self.auth_required else "off"
        )
        headers = {
            "Content-Security-Policy": content_security_policy(ws_url),
            "Cache-Control": "no-store",
            **_SECURITY_HEADERS,
        }
        return Response(body, 200, headers=headers, media_type="text/html; charset=utf-8")
