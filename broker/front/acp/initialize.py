"""ACP ``initialize``: the protocol version and capabilities a connection negotiates.

A node's clients reconnecting elsewhere at once send thousands of ``initialize`` a second,
all answered alike: the results are kept as JSON text, per version and tenant, for as long
as what the agents advertised stays the same object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import fastjson
from ...config import Settings
from ...protocol import capabilities, presence, v2
from ...protocol.commands import AgentGateway
from ...protocol.jsonrpc import INVALID_REQUEST, JsonObject, Request, RpcError, invalid_params
from ...protocol.operations import client_instance_id
from ..list_changes import ListChanges
from .access import Access
from .connection import ClientConnection

PROTOCOL_VERSION = 1
TENANT_META = "acpBroker/tenant"
"""``_meta`` key of the v2 ``initialize`` reply: the tenant the connection acts for."""
AGENTS_META = "acpBroker/agents"
"""``_meta`` key of the v2 ``initialize`` reply: the configured agents, the default first."""

_INITIALIZED_ENTRIES = 1024
"""``initialize`` results kept (one per version, and per tenant for v2's)."""


@dataclass
class _InitializeCache:
    """``initialize`` results as JSON text, valid for one ``agent_capabilities()`` object."""

    agents: JsonObject | None = None
    texts: dict[tuple[int, str], str] = field(default_factory=dict)


@dataclass
class Initializer:
    """Answers ``initialize`` (see the module's docstring)."""

    settings: Settings
    host: AgentGateway
    access: Access
    list_changes: ListChanges | None = None
    """The connections told of their tenant's list changes (those that ask, at initialize)."""
    _initialized: _InitializeCache = field(default_factory=lambda: _InitializeCache(), repr=False)

    async def initialize(self, conn: ClientConnection, request: Request) -> fastjson.Fragment:
        await self.host.refresh_capabilities()
        return self.initialize_now(conn, request)

    def initialize_now(self, conn: ClientConnection, request: Request) -> fastjson.Fragment:
        if conn.protocol_version is not None:
            raise RpcError(INVALID_REQUEST, "the connection is already initialized")
        version = request.params.get("protocolVersion")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise invalid_params("protocolVersion must be a non-negative integer")
        negotiated = v2.negotiate(version)
        caps_field = "clientCapabilities" if negotiated == PROTOCOL_VERSION else "capabilities"
        caps = request.params.get(caps_field)
        conn.client_capabilities = caps if isinstance(caps, dict) else {}
        conn.client_instance = client_instance_id(request.params)
        conn.display_name = presence.display_name(request.params)
        conn.protocol_version = negotiated
        if self.list_changes is not None:
            self.list_changes.follow(conn)
        return self._initialize_result(negotiated, conn.tenant)

    def _initialize_result(self, version: int, tenant: str) -> fastjson.Fragment:
        """The ``initialize`` result as JSON text, made once per version and tenant until
        what the agents advertised changes: a node's clients reconnecting elsewhere at once
        send thousands a second, all answered alike."""
        agents = self.host.agent_capabilities()
        cache = self._initialized
        if cache.agents is not agents or len(cache.texts) >= _INITIALIZED_ENTRIES:
            cache.agents, cache.texts = agents, {}
        key = (version, tenant if version == v2.V2 else "")
        text = cache.texts.get(key)
        if text is None:
            text = cache.texts[key] = fastjson.dumps(self._fresh_initialize_result(version, tenant))
        return fastjson.Fragment(text)

    def _fresh_initialize_result(self, version: int, tenant: str) -> JsonObject:
        agents = self.host.agent_capabilities()
        if version == v2.V2:
            result = v2.initialize_result(agents)
            result["authMethods"] = self.access.auth_methods(v2.V2)
            result["_meta"] = self._broker_meta(tenant)
            return result
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": capabilities.v1_agent_capabilities(agents),
            "authMethods": self.access.auth_methods(PROTOCOL_VERSION),
            "agentInfo": dict(v2.BROKER_INFO),
        }

    def _broker_meta(self, tenant: str) -> JsonObject:
        """What a v2 client learns of this deployment at ``initialize``: the tenant it acts
        for, and the agents it may start sessions on (the default first)."""
        agents = [{"name": a.name, "kind": a.kind} for a in self.settings.agent_list()]
        return {TENANT_META: tenant, AGENTS_META: agents}
