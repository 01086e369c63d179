"""A hostile tenant's agent against a sealed agent host, end to end; and the same unsealed.

Two tenants, each with an API token, reach a front node (``serve --no-workers``) backed by a
real password-protected ``redis-server``; the agents run on an agent host running as its
own process (``worker agent-host``), given the Redis URL on its command line and the JWT
secret in its environment, as an operator might. Tenant A's agent is the hostile test agent
(``tests/agents/hostile_agent.py``): prompted, it tries what a malicious tenant would ask of
a real agent. Sealed (``sandbox = "on"``), every attempt fails and the host and tenant B's
session carry on; unsealed (``sandbox = "off"``), the same attempts succeed, which shows
what the sandbox protects and that these tests can fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from broker.auth.tokens import TokenStore
from broker.store.client import connect

from .conftest import AGENTS
from .support.broker_process import BrokerProcess, broker_process
from .support.client import RawClient, text
from .support.redis_server import password_server, port_of
from .support.roles import RoleProcess, role_process

PASSWORD = "redis-password-the-agent-must-not-learn"
JWT_SECRET = "jwt-secret-the-agent-must-not-learn-0123456789"
TMP_BYTES = 4 * 1024 * 1024
FILL = 16 * 1024 * 1024
TIMEOUT = 240.0  # a loaded 2-core machine takes 3-5 s to start each agent process


@dataclass
class Deployment:
    """What a test drives: the front, the agent host, the tenants' connections and dirs."""

    front: BrokerProcess
    host: RoleProcess
    config: Path
    redis: str
    url: str
    clients: dict[str, RawClient]
    cwds: dict[str, Path]


def _config(tmp_path: Path, url: str, sandbox: str) -> Path:
    """The broker's TOML file, in a folder sealed agents see (as ``/etc`` would be)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    path = etc / "acp-broker.toml"
    agent = [sys.executable, str(AGENTS / "hostile_agent.py")]
    path.write_text(
        f'redis_url = "{url}"\n'
        f'jwt_secret = "{JWT_SECRET}"\n'
        'cursor_secret = "cursor-secret-the-agent-must-not-learn"\n'
        'auth = "on"\n'
        f'sandbox = "{sandbox}"\n'
        f"sandbox_tmp_bytes = {TMP_BYTES}\n"
        "[[agents]]\n"
        'name = "hostile"\n'
        f"command = {json.dumps(agent)}\n"
        f"ro_paths = [{json.dumps(str(etc))}]\n"
        "[[agents]]\n"
        'name = "offline"\n'
        f"command = {json.dumps(agent)}\n"
        "network = false\n"
    )
    return path


async def _token(url: str, tenant: str) -> str:
    store = connect(url)
    try:
        created, _ = await TokenStore(store).create(tenant, ["read", "write"])
    finally:
        await store.aclose()
    return created


@contextlib.asynccontextmanager
async def deployment(tmp_path: Path, sandbox: str) -> AsyncIterator[Deployment]:
    with password_server(PASSWORD) as bare:
        url = bare.replace("redis://", f"redis://:{PASSWORD}@")
        config = _config(tmp_path, url, sandbox)
        env = {"ACP_BROKER_CONFIG": str(config), "ACP_BROKER_JWT_SECRET": JWT_SECRET}
        env["ACP_BROKER_SANDBOX"] = sandbox  # the tests' own default is off
        cwds = {tenant: tmp_path / tenant for tenant in ("team-a", "team-b")}
        for tenant, cwd in cwds.items():
            cwd.mkdir()
            (cwd / "secret.txt").write_text(f"{tenant}'s own file")
        async with contextlib.AsyncExitStack() as stack:
            # The operator's mistake the warning is about: the password on the command line.
            host = await stack.enter_async_context(
                role_process("agent-host", url, tmp_path / "host.log", agents=(), env=env)
            )
            front = await stack.enter_async_context(
                broker_process(
                    None,
                    log_path=tmp_path / "front.log",
                    agents=(),
                    env=env,
                    extra_args=["--no-workers"],
                )
            )
            clients = {}
            for tenant in cwds:
                headers = {"Authorization": f"Bearer {await _token(url, tenant)}"}
                clients[tenant] = await RawClient.initialized(front.url, additional_headers=headers)
            address = f"127.0.0.1:{port_of(bare)}"
            yield Deployment(front, host, config, address, url, clients, cwds)
            for client in clients.values():
                await client.close()


async def _new(deploy: Deployment, tenant: str, agent: str = "hostile") -> str:
    params: dict[str, Any] = {"cwd": str(deploy.cwds[tenant]), "mcpServers": []}
    params["_meta"] = {"acpBroker/agent": agent}
    reply = await deploy.clients[tenant].call("session/new", params, timeout=60)
    return str(reply["result"]["sessionId"])


async def _say(deploy: Deployment, tenant: str, session_id: str, words: str) -> str:
    client = deploy.clients[tenant]
    before = len(client.chunks(session_id))
    reply = await client.call(
        "session/prompt", {"sessionId": session_id, "prompt": text(words)}, timeout=60
    )
    assert reply["result"]["stopReason"] == "end_turn", reply
    return "".join(client.chunks(session_id)[before:])


async def _attack(deploy: Deployment, signal_number: int) -> tuple[dict[str, Any], str]:
    """Tenant A's agent probes while tenant B has a session of its own; returns the
    report and tenant B's session."""
    theirs = await _new(deploy, "team-b")
    assert await _say(deploy, "team-b", theirs, "before") == "before"
    mine = await _new(deploy, "team-a")
    orders = {
        "config": str(deploy.config),
        "other_cwd": str(deploy.cwds["team-b"]),
        "host_pid": deploy.host.proc.pid,
        "signal": signal_number,
        "tmp_bytes": FILL,
        "redis": deploy.redis,
    }
    report = json.loads(await _say(deploy, "team-a", mine, json.dumps(orders)))
    return report, theirs


def _agent_processes(host: RoleProcess) -> list[psutil.Process]:
    """The agent processes under the host (the sandbox's own first process counts once)."""
    children = psutil.Process(host.proc.pid).children()
    return [child for child in children if "hostile_agent.py" in " ".join(child.cmdline())]


async def test_a_sealed_agent_reaches_no_secret_no_other_tenant_and_not_the_host(
    tmp_path: Path,
) -> None:
    async with asyncio.timeout(TIMEOUT), deployment(tmp_path, "on") as deploy:
        report, theirs = await _attack(deploy, signal.SIGKILL)
        dump = json.dumps(report)
        for secret in (PASSWORD, JWT_SECRET, "cursor-secret-the-agent"):
            assert secret not in dump
        # Its parent is the sandbox's first process, whose environment is the filtered one.
        assert "ACP_BROKER" not in report["parent_environ"]["data"]
        assert "agent-host" not in report["parent_cmdline"]["data"]
        # Its /proc shows its own few processes: neither the host nor Redis.
        assert report["proc"]["ok"]
        assert str(deploy.host.proc.pid) not in report["proc"]["data"]
        assert "redis-server" not in json.dumps(report["proc"]["data"])
        assert "worker" not in json.dumps(report["proc"]["data"])
        # The configuration file is covered; the other tenant's folder is not there.
        assert not report["config"]["data"].strip() or not report["config"]["ok"]
        assert not report["other_cwd_read"]["ok"]
        assert not report["other_cwd_write"]["ok"]
        assert not (deploy.cwds["team-b"] / "written-by-another-tenant.txt").exists()
        # No URL found; Redis at its address wants the password it never learnt.
        assert not report["redis"]["ok"]
        assert "NOAUTH" in report["redis"]["data"]
        # The host's pid is no process in its namespace; /tmp is full at its size.
        assert not report["signal"]["ok"]
        assert not report["fill_tmp"]["ok"]
        assert f"after {TMP_BYTES} bytes" in report["fill_tmp"]["data"]
        # The host survives, tenant B's session (in its own process) carries on.
        assert deploy.host.proc.returncode is None
        assert await _say(deploy, "team-b", theirs, "after") == "after"
        assert len(_agent_processes(deploy.host)) == 2  # one per tenant
        # Its own folder it may write.
        mine = await _new(deploy, "team-a")
        orders: dict[str, Any] = {"other_cwd": str(deploy.cwds["team-a"]), "config": "/none"}
        orders |= {"host_pid": 0, "signal": 0, "tmp_bytes": 0, "redis": deploy.redis}
        own = json.loads(await _say(deploy, "team-a", mine, json.dumps(orders)))
        assert own["other_cwd_read"] == {"ok": True, "data": "team-a's own file"}
        assert own["other_cwd_write"]["ok"]
        # Handed the full URL (leaked some other way), an agent with the network reaches
        # Redis (keeping Redis off the agents' network is the operator's part); one whose
        # spec says network = false reaches nothing.
        orders["urls"] = [deploy.url]
        handed = json.loads(await _say(deploy, "team-a", mine, json.dumps(orders)))
        assert handed["redis"]["ok"]
        offline = await _new(deploy, "team-a", agent="offline")
        cut = json.loads(await _say(deploy, "team-a", offline, json.dumps(orders)))
        assert not cut["redis"]["ok"] and "NOAUTH" not in cut["redis"]["data"]
    assert "agents run sealed by bubblewrap" in (tmp_path / "host.log").read_text()


async def test_unsealed_the_same_agent_reaches_all_of_it(tmp_path: Path) -> None:
    """Without the sandbox every attempt works: what the sealed test shows closed is open
    (signal 0: the host could have been killed, and is not)."""
    async with asyncio.timeout(TIMEOUT), deployment(tmp_path, "off") as deploy:
        report, theirs = await _attack(deploy, 0)
        assert JWT_SECRET in report["parent_environ"]["data"]
        assert PASSWORD in report["parent_cmdline"]["data"]
        assert str(deploy.host.proc.pid) in report["proc"]["data"]
        assert PASSWORD in report["config"]["data"]
        assert report["other_cwd_read"] == {"ok": True, "data": "team-b's own file"}
        assert report["other_cwd_write"]["ok"]
        assert (deploy.cwds["team-b"] / "written-by-another-tenant.txt").exists()
        assert report["redis"]["ok"] and "via a found URL" in report["redis"]["data"]
        assert report["signal"]["ok"]
        assert report["fill_tmp"] == {"ok": True, "data": FILL}
        assert await _say(deploy, "team-b", theirs, "after") == "after"
        # Even unsealed, tenants do not share a process.
        assert len(_agent_processes(deploy.host)) == 2
    assert "a secret given as --redis-url" in (tmp_path / "host.log").read_text()
