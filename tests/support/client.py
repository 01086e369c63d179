"""Test clients: the ``acp`` package's client over the broker's WebSocket, and a raw one."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import websockets
from acp import Client, connect_to_agent, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse
from acp.ws import create_websocket_stream
from mcp.types import CallToolResult, TextContent

from .schemas import WireChecker

#: How long a test waits by default for what it polls or reads: a bound on work whose
#: duration scales with the machine's load (two pytest workers, benchmarks, other builds on
#: two cores), not an estimate of it: a condition met returns at once, so only a failing
#: test waits it out. A test that waits for more says so in its own bound.
LOADED_WAIT = 60.0
#: The request deadline (``request_timeout``) of the brokers the tests start, in place of
#: the default 30 s (``make_settings``, ``broker_env``; a test that tests a deadline sets its
#: own): a tenant's first ``session/new`` starts its agent process, whose imports (the ACP
#: SDK's schema) take 1 s alone and 30 s and more when the suite's two workers share two
#: cores with other work, and the broker then answers "try again" as it should.
BROKER_DEADLINE = LOADED_WAIT
#: How long a request's reply is waited for: a little past the broker's own request
#: deadline, so a reply that is late shows as the broker's error.
REPLY_WAIT = BROKER_DEADLINE + 5.0


async def wait_for(
    condition: Callable[[], Any], timeout: float = LOADED_WAIT, what: str = ""
) -> Any:
    """Poll ``condition`` until it is truthy (bounded); returns its value. ``condition`` may
    return an awaitable (a probe that asks the broker), which is awaited."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.01)


def tool_result_text(result: CallToolResult) -> str:
    """The text of an MCP tool's result: the broker's tools answer in one text block."""
    block = result.content[0]
    assert isinstance(block, TextContent), result.content
    return block.text


@dataclass
class RecordingClient:
    """An ACP client that records every session/update and answers permission requests."""

    permission: str = "allow"  # allow | reject | wait
    updates: list[tuple[str, Any]] = field(default_factory=list)
    raw: list[dict[str, Any]] = field(default_factory=list)
    permission_requests: list[Any] = field(default_factory=list)
    release_permission: asyncio.Event = field(default_factory=asyncio.Event)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self.raw.append(kwargs)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: Any, **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permission_requests.append((session_id, tool_call, options))
        if self.permission == "wait":
            await self.release_permission.wait()
        if self.permission == "reject":
            option = next(o for o in options if o.kind.startswith("reject"))
        else:
            option = next(o for o in options if o.kind.startswith("allow"))
        if self.permission == "cancel":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(option_id=option.option_id, outcome="selected")
        )

    def kinds(self, session_id: str | None = None) -> list[str]:
        return [
            u.session_update for sid, u in self.updates if session_id is None or sid == session_id
        ]

    def texts(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        return "".join(
            u.content.text
            for sid, u in self.updates
            if sid == session_id and u.session_update == kind and hasattr(u.content, "text")
        )


@dataclass
class AcpTestClient:
    """A connected, initialized ``acp`` client."""

    conn: ClientSideConnection
    client: RecordingClient
    init: Any

    async def new(
        self, cwd: str = "/tmp/project", *, agent: str | None = None, **kwargs: Any
    ) -> str:
        """A new session. ``agent`` picks the broker's agent (``_meta["acpBroker/agent"]``);
        other keywords go to ``new_session`` (its own parameters, or else into ``_meta``)."""
        if agent is not None:
            kwargs["acpBroker/agent"] = agent
        response = await self.conn.new_session(cwd=cwd, **kwargs)
        return response.session_id

    async def prompt(self, session_id: str, text: str) -> Any:
        return await self.conn.prompt(session_id=session_id, prompt=[text_block(text)])

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Any request, raw (for methods the acp client does not wrap)."""
        return await self.conn._conn.send_request(method, params)

    async def close(self) -> None:
        await self.conn.close()


async def acp_client(url: str, *, permission: str = "allow", fs: bool = False) -> AcpTestClient:
    transport = await create_websocket_stream(url)
    client = RecordingClient(permission=permission)
    # acp's Client protocol names every client method, but the connection looks each one up
    # (getattr) and answers method-not-found for those this recording client lacks.
    conn = connect_to_agent(cast(Client, client), transport)
    from acp.schema import ClientCapabilities, FileSystemCapabilities

    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=fs, write_text_file=fs))
    init = await conn.initialize(protocol_version=1, client_capabilities=caps)
    return AcpTestClient(conn, client, init)


class RawClient:
    """A bare WebSocket speaking JSON-RPC by hand, for malformed and edge-case traffic.

    Once its ``initialize`` is answered, every message it receives is validated against
    the newest official schema of the negotiated version (:class:`.schemas.WireChecker`).
    """

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 1000
        self.inbox: list[dict[str, Any]] = []
        self.checker: WireChecker | None = None
        self._initialize_ids: set[Any] = set()

    @classmethod
    async def connect(cls, url: str, **kwargs: Any) -> RawClient:
        return cls(await websockets.connect(url, max_size=None, **kwargs))

    @classmethod
    async def initialized(cls, url: str, **kwargs: Any) -> RawClient:
        """:meth:`connect`, then ``initialize`` (its reply not looked at)."""
        client = await cls.connect(url, **kwargs)
        await client.initialize()
        return client

    async def send(self, payload: Any) -> None:
        self._sending(payload)
        await self.ws.send(payload if isinstance(payload, str | bytes) else json.dumps(payload))

    async def recv(self, timeout: float = LOADED_WAIT) -> Any:
        """The next message (TimeoutError after ``timeout`` seconds). Bounded with
        ``asyncio.timeout``, not ``wait_for``: Python 3.11's ``wait_for`` returns the
        frame, swallowing the cancellation, when its task is cancelled in the same loop
        step as a frame arrives, so a reader cancelled under traffic read on for ever."""
        async with asyncio.timeout(timeout):
            raw = await self.ws.recv()
        message = json.loads(raw)
        if self.checker is not None:
            self.checker.check(message)
        elif isinstance(message, dict) and message.get("id") in self._initialize_ids:
            version = (message.get("result") or {}).get("protocolVersion")
            if isinstance(version, int) and version in (1, 2):
                self.checker = WireChecker(version)
                self.checker.sending(
                    {"jsonrpc": "2.0", "id": message["id"], "method": "initialize"}
                )
                self.checker.check(message)
        return message

    def _sending(self, payload: Any) -> None:
        """Remember the methods of the requests going out (what their replies are checked by)."""
        if isinstance(payload, bytes):
            return
        if isinstance(payload, str):
            try:
                payload = json.loads(payload)
            except (ValueError, RecursionError):  # what hostile-input tests send
                return
        messages = payload if isinstance(payload, list) else [payload]
        requests = [
            m
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("id"), int | str) and "method" in m
        ]
        for request in requests:
            if request["method"] == "initialize":
                self._initialize_ids.add(request["id"])
        if self.checker is not None and requests:
            self.checker.sending(requests)

    async def call(
        self, method: str, params: Any = None, timeout: float = REPLY_WAIT
    ) -> dict[str, Any]:
        """Send a request and return its reply; notifications that come first go to ``inbox``."""
        self.next_id += 1
        msg_id = self.next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.reply_to(msg_id, timeout)

    async def new_session(self, cwd: str, timeout: float = REPLY_WAIT) -> str:
        """A new session in ``cwd`` (no MCP servers): its id."""
        reply = await self.call("session/new", {"cwd": cwd, "mcpServers": []}, timeout)
        return str(reply["result"]["sessionId"])

    async def send_prompt(self, msg_id: Any, session_id: str, words: str) -> None:
        """Send ``session/prompt`` of ``words`` as request ``msg_id``, not awaiting its reply
        (read it with :meth:`reply_to`)."""
        params = {"sessionId": session_id, "prompt": text(words)}
        await self.send(
            {"jsonrpc": "2.0", "id": msg_id, "method": "session/prompt", "params": params}
        )

    async def reply_to(self, msg_id: Any, timeout: float = REPLY_WAIT) -> dict[str, Any]:
        while True:
            message = await self.recv(timeout)
            if message.get("id") == msg_id and "method" not in message:
                return message
            self.inbox.append(message)

    async def read_until(self, condition: Callable[[], Any], timeout: float = LOADED_WAIT) -> None:
        """Receive into ``inbox`` until ``condition()`` holds (bounded)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {condition}")
            self.inbox.append(await self.recv(left))

    def updates(self, session_id: str) -> list[dict[str, Any]]:
        """The params of the session's ``session/update`` notifications in ``inbox``."""
        return [
            m["params"]
            for m in self.inbox
            if m.get("method") == "session/update" and m["params"]["sessionId"] == session_id
        ]

    def chunks(self, session_id: str | None = None) -> list[str]:
        """The texts of the agent's message chunks in ``inbox``: the session's, or (without
        one) every session's."""
        return [
            m["params"]["update"]["content"]["text"]
            for m in self.inbox
            if m.get("method") == "session/update"
            and (session_id is None or m["params"]["sessionId"] == session_id)
            and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        ]

    async def read_chunks(self, session_id: str, count: int, timeout: float) -> list[str]:
        """The session's chunk texts, once ``count`` of them have been received (bounded)."""
        await self.read_until(lambda: len(self.chunks(session_id)) >= count, timeout)
        return self.chunks(session_id)

    async def initialize(self) -> dict[str, Any]:
        return await self.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

    async def close(self) -> None:
        await self.ws.close()


def text(value: str) -> list[dict[str, Any]]:
    return [text_block(value).model_dump(by_alias=True, exclude_none=True)]
