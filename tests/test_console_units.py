"""The console's server side without a browser: where the page's WebSocket is, its policy,
which origins may open the WebSocket, what the HTTP port serves."""

from __future__ import annotations

import httpx2
import pytest
import websockets

from broker.front.http.console import content_security_policy, same_origin_console, websocket_url
from broker.serve import Broker

from .conftest import make_settings


def test_the_page_finds_its_websocket_behind_a_proxy_or_straight_from_a_node() -> None:
    settings = make_settings()
    direct = {"host": "broker.lan:8766"}
    assert websocket_url(settings, direct, 8765) == "//broker.lan:8765/acp"
    assert websocket_url(settings, {"host": "[::1]:8766"}, 8765) == "//[::1]:8765/acp"
    proxied = {"host": "acp.example.com", "x-forwarded-for": "10.0.0.1"}
    assert websocket_url(settings, proxied, 8765) == "/acp"
    assert websocket_url(settings, {"host": "h", "forwarded": "for=1.2.3.4"}, 1) == "/acp"
    fixed = make_settings(console_ws_url="wss://acp.example.com/acp")
    assert websocket_url(fixed, direct, 8765) == "wss://acp.example.com/acp"


def test_the_policy_allows_scripts_from_the_origin_only_and_names_the_websocket() -> None:
    policy = content_security_policy("//broker.lan:8765/acp")
    assert "default-src 'none'" in policy and "script-src 'self';" in policy
    assert "connect-src 'self' ws://broker.lan:8765 wss://broker.lan:8765;" in policy
    assert "connect-src 'self';" in content_security_policy("/acp")
    assert "unsafe" not in policy


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("http://broker.lan:8766", "broker.lan:8765", True),  # the page from this node
        ("https://acp.example.com", "acp.example.com", True),  # one origin behind a proxy
        ("http://evil.example:8766", "broker.lan:8765", False),
        ("http://broker.lan:9999", "broker.lan:8765", False),
        ("null", "broker.lan:8765", False),
        ("http://broker.lan:8766", None, False),
    ],
)
def test_only_the_consoles_own_origin_may_open_the_websocket(
    origin: str, host: str | None, allowed: bool
) -> None:
    assert same_origin_console(origin, host, 8766) is allowed


async def test_the_http_port_serves_the_page_its_files_and_refuses_other_origins(
    broker: Broker,
) -> None:
    base = f"http://127.0.0.1:{broker.http_port}"
    async with httpx2.AsyncClient(timeout=10) as http:
        page = await http.get(f"{base}/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert f'content="//127.0.0.1:{broker.port}/acp"' in page.text
        script = await http.get(f"{base}/console/app.js")
        assert script.headers["content-type"].startswith("text/javascript")
        again = await http.get(
            f"{base}/console/app.js", headers={"If-None-Match": script.headers["etag"]}
        )
        assert again.status_code == 304
        for missing in ("/console/nothing.js", "/console/%2E%2E/front/console.py"):
            assert (await http.get(f"{base}{missing}")).status_code == 404
    url = f"ws://127.0.0.1:{broker.port}/acp"
    own = f"http://127.0.0.1:{broker.http_port}"
    async with websockets.connect(url, origin=websockets.Origin(own)) as ws:
        assert ws.response is not None
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, origin=websockets.Origin("http://evil.example")):
            pass
    assert refused.value.response.status_code == 403
