"""What the agents behind the broker can take, and what the broker may promise its clients.

Pure functions over the (v1) ``agentCapabilities`` each agent advertised when it
started. Two rules, one for each direction:

- **Advertised**: the broker promises a capability that depends on the agent
  (prompt content beyond text and resource links, MCP transports beyond stdio,
  forking) only when *every* configured agent advertised it, so the promise
  holds whichever agent a client's session runs on. An agent that has not
  started yet (its capabilities are unknown) advertises nothing.
- **Checked**: every request is checked against the capabilities of the agent
  of its own session, whatever was advertised; what that agent did not
  advertise is refused with -32602 naming the capability, and never sent to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .jsonrpc import JsonObject, RpcError, invalid_params

PROMPT_KINDS = ("image", "audio", "embeddedContext")
"""v1 ``promptCapabilities`` flags (text and resource links need none)."""
MCP_KINDS = ("http", "sse")
"""v1 ``mcpCapabilities`` flags (stdio needs none: every agent takes it)."""
_BLOCK_NEEDS = {"image": "image", "audio": "audio", "resource": "embeddedContext"}
"""Content block type -> the ``promptCapabilities`` flag an agent must have set for it."""


def prompt_flags(caps: JsonObject) -> dict[str, bool]:
    """An agent's ``promptCapabilities``, every flag present (v1 booleans)."""
    given = caps.get("promptCapabilities")
    given = given if isinstance(given, dict) else {}
    return {kind: given.get(kind) is True for kind in PROMPT_KINDS}


def mcp_flags(caps: JsonObject) -> dict[str, bool]:
    """An agent's ``mcpCapabilities``, every flag present (v1 booleans)."""
    given = caps.get("mcpCapabilities")
    given = given if isinstance(given, dict) else {}
    return {kind: given.get(kind) is True for kind in MCP_KINDS}


def supports_session(caps: JsonObject, capability: str) -> bool:
    """Whether an agent advertised ``sessionCapabilities.<capability>`` (an object)."""
    session = caps.get("sessionCapabilities")
    return isinstance(session, dict) and isinstance(session.get(capability), dict)


def combined(agents: Iterable[str], known: Mapping[str, JsonObject]) -> JsonObject:
    """What every one of ``agents`` advertised (v1 shapes): ``promptCapabilities``,
    ``mcpCapabilities`` and whether all of them fork (``fork``)."""
    names = list(agents)
    caps = [known.get(name) or {} for name in names]
    return {
        "promptCapabilities": {
            kind: all(prompt_flags(c)[kind] for c in caps) and bool(caps) for kind in PROMPT_KINDS
        },
        "mcpCapabilities": {
            kind: all(mcp_flags(c)[kind] for c in caps) and bool(caps) for kind in MCP_KINDS
        },
        "fork": bool(caps) and all(supports_session(c, "fork") for c in caps),
    }


def check_prompt(agent: str, caps: JsonObject, prompt: Any) -> None:
    """Refuse (-32602) content blocks the agent did not advertise it takes."""
    if not isinstance(prompt, list):
        return
    flags = prompt_flags(caps)
    for block in prompt:
        kind = block.get("type") if isinstance(block, dict) else None
        needs = _BLOCK_NEEDS.get(kind) if isinstance(kind, str) else None
        if needs is not None and not flags[needs]:
            raise _refused(agent, f"{kind} content blocks", f"promptCapabilities.{needs}")


def check_mcp_servers(agent: str, caps: JsonObject, servers: Any) -> None:
    """Refuse (-32602) MCP servers over a transport the agent did not advertise."""
    if not isinstance(servers, list):
        return
    flags = mcp_flags(caps)
    for server in servers:
        kind = server.get("type") if isinstance(server, dict) else None
        if kind in MCP_KINDS and not flags[kind]:
            raise _refused(agent, f"{kind} MCP servers", f"mcpCapabilities.{kind}")


def check_session(agent: str, caps: JsonObject, capability: str, what: str) -> None:
    """Refuse (-32602) a session method the agent did not advertise."""
    if not supports_session(caps, capability):
        raise _refused(agent, what, f"sessionCapabilities.{capability}")


def _refused(agent: str, what: str, capability: str) -> RpcError:
    return invalid_params(
        f"agent {agent!r} does not take {what}: it does not advertise {capability}",
        {"capability": capability, "agent": agent},
    )


# -- the broker's own extensions -----------------------------------------------------------------

LIST_CHANGED_META = "acpBroker/listChanged"
"""The capability (``_meta`` of the client's capabilities at ``initialize``, v1 and v2; and of
the broker's, which advertises it) of :data:`LIST_CHANGED_METHOD`."""
LIST_CHANGED_METHOD = "_acpBroker/session/list_changed"
"""An extension notification (ACP reserves method names that begin with ``_`` for them):
the tenant's session list changed, so a listing the client shows should be read again.
Params ``{}``; sent only to connections that declared :data:`LIST_CHANGED_META`."""
EXTENSIONS_META: JsonObject = {LIST_CHANGED_META: True}
"""What ``initialize`` advertises in the capabilities' ``_meta``: the extensions a client
may ask for (the extensibility page: custom capabilities are advertised there)."""


def opted_in(client_capabilities: JsonObject, key: str) -> bool:
    """Whether a client declared ``key`` true in its capabilities' ``_meta`` at ``initialize``
    (how a client asks for one of the broker's extensions; anything but ``true`` is no)."""
    meta = client_capabilities.get("_meta")
    return isinstance(meta, dict) and meta.get(key) is True


# -- what initialize advertises -----------------------------------------------------------------


def v1_agent_capabilities(agents: JsonObject) -> JsonObject:
    """The v1 ``agentCapabilities``: the broker's own session methods, and what ``agents``
    (:func:`combined`) all take. ``title`` and ``fork`` are ACP unstable capabilities."""
    session: JsonObject = {
        "list": {},
        "resume": {},
        "close": {},
        "delete": {},
        "additionalDirectories": {},
        "title": {},
    }
    if agents["fork"]:
        session["fork"] = {}
    return {
        "loadSession": True,
        "promptCapabilities": dict(agents["promptCapabilities"]),
        "mcpCapabilities": dict(agents["mcpCapabilities"]),
        "sessionCapabilities": session,
        "_meta": dict(EXTENSIONS_META),
    }


def v2_session_capabilities(agents: JsonObject) -> JsonObject:
    """The v2 ``capabilities.session``: v2 support markers are objects, absent when unsupported
    (v2 has no SSE MCP transport; stdio is every agent's)."""
    prompt = agents["promptCapabilities"]
    session: JsonObject = {
        "prompt": {kind: {} for kind in PROMPT_KINDS if prompt[kind]},
        "mcp": {"stdio": {}, **({"http": {}} if agents["mcpCapabilities"]["http"] else {})},
        "delete": {},
        "additionalDirectories": {},
        "title": {},
    }
    if agents["fork"]:
        session["fork"] = {}
    return session
