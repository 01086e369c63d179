"""The sandbox's parts on an in-process broker: processes per tenant (and directories, or
session), idle ones stopped, an agent that must run sealed refused where it cannot be,
secrets read from files, ``doctor``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.cli.doctor import report
from broker.config import AgentSpec, load_settings
from broker.protocol.jsonrpc import RpcError
from broker.serve import Broker
from broker.store.client import connect
from workers.agent_host.host import AgentHost
from workers.agent_host.sandbox import SandboxPlan

from .conftest import demo_agent, make_settings, plain_agent, run_cli
from .support.client import wait_for


@pytest.fixture
async def node(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    overrides: dict[str, Any] = {"agents": [plain_agent()], "sandbox": "auto"}
    overrides |= getattr(request, "param", {})
    broker = Broker(make_settings(**overrides), redis=connect(None))
    await broker.start()
    yield broker
    await broker.stop()


def _host(node: Broker) -> AgentHost:
    assert node.worker is not None
    return node.worker.host


async def _new(host: AgentHost, tenant: str, cwd: str, agent: str = "plain") -> str:
    params = {"cwd": cwd, "mcpServers": []}
    session_id, _ = await host.new_session(
        tenant, params, agent=agent, kind="shell", meta={}, origin="test"
    )
    return session_id


async def test_no_process_runs_two_tenants_sessions(node: Broker) -> None:
    host = _host(node)
    a1 = await _new(host, "team-a", "/w/a")
    a2 = await _new(host, "team-a", "/w/a")
    b1 = await _new(host, "team-b", "/w/a")
    a3 = await _new(host, "team-a", "/w/other")  # sealed: its mounts are another process's
    agent = {sid: host.sessions.by_id[sid].agent for sid in (a1, a2, b1, a3)}
    assert agent[a1] is agent[a2]
    assert len({id(agent[s]) for s in (a1, b1, a3)}) == 3
    assert {p.tenant for p in host.agents.processes()} == {"team-a", "team-b"}


@pytest.mark.parametrize(
    "node",
    [{"agents": [AgentSpec(name="plain", command=plain_agent().command, process_per="session")]}],
    indirect=True,
)
async def test_a_spec_may_ask_for_a_process_per_session(node: Broker) -> None:
    host = _host(node)
    one, two = await _new(host, "team-a", "/w"), await _new(host, "team-a", "/w")
    assert host.sessions.by_id[one].agent is not host.sessions.by_id[two].agent


@pytest.mark.parametrize("node", [{"agents": [demo_agent()]}], indirect=True)
async def test_a_process_running_a_prompt_is_not_reaped(node: Broker) -> None:
    host = _host(node)
    session_id = await _new(host, "team-a", "/w", agent="demo")
    params = {"prompt": [{"type": "text", "text": "/slow 10"}]}
    turn = asyncio.ensure_future(host.prompt("team-a", session_id, params, "o"))
    await wait_for(lambda: host.sessions.by_id[session_id].prompt_task is not None)
    assert await host.reaper.reap(0.0) == 0  # idle or not: its turn runs
    assert (await turn).result["stopReason"] == "end_turn"
    assert await host.reaper.reap(0.0) == 1
    assert not host.agents.processes()


@pytest.mark.parametrize("node", [{"max_agent_processes": 2}], indirect=True)
async def test_agent_processes_per_host_are_capped(node: Broker) -> None:
    host = _host(node)
    await _new(host, "team-a", "/w")
    await _new(host, "team-b", "/w")
    await _new(host, "team-a", "/w")  # its process is there: no new one
    with pytest.raises(RpcError) as caught:
        await _new(host, "team-c", "/w")
    assert caught.value.code == -32005
    assert caught.value.data == {"limit": "max_agent_processes"}
    assert len(host.agents.processes()) == 2
    await host.reaper.reap(0.0)  # idle ones stopped: room again
    await _new(host, "team-c", "/w")


@pytest.mark.parametrize(
    "node", [{"agents": [AgentSpec(name="gone", command=["/nonexistent/agent"])]}], indirect=True
)
async def test_a_sealed_agent_that_cannot_start_says_why_in_one_line(node: Broker) -> None:
    with pytest.raises(RpcError) as caught:
        await _new(_host(node), "team-a", "/w", agent="gone")
    message = caught.value.message
    assert message.startswith("agent 'gone' exited with code 1: bwrap: execvp /nonexistent/agent")
    assert "\n" not in message


async def test_a_sealed_agent_gets_no_writable_root(node: Broker) -> None:
    with pytest.raises(RpcError) as caught:
        await _new(_host(node), "team-a", "/")
    assert caught.value.code == -32602
    assert "cannot be given / as a working directory" in caught.value.message


@pytest.mark.parametrize("node", [{"agent_idle_timeout": 0.4}], indirect=True)
async def test_idle_processes_are_stopped_and_their_sessions_come_back(node: Broker) -> None:
    host = _host(node)
    session_id = await _new(host, "team-a", "/w")
    first = host.sessions.by_id[session_id].agent
    await wait_for(lambda: not host.agents.processes(), timeout=10, what="the idle process gone")
    assert first.failed and not host.holds(session_id)
    assert (await node.log.snapshot("team-a", session_id)).status == "STOPPED"
    outcome = await host.prompt(
        "team-a", session_id, {"prompt": [{"type": "text", "text": "hi"}]}, "o"
    )
    assert outcome.result["stopReason"] == "end_turn"
    assert host.sessions.by_id[session_id].agent is not first
    assert (await node.log.snapshot("team-a", session_id)).status == "RUNNING"


@pytest.mark.parametrize("node", [{"sandbox": "on"}], indirect=True)
async def test_an_agent_that_must_run_sealed_where_it_cannot_is_refused_in_one_line(
    node: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap to find
    host = _host(node)
    host.agents.sealer._sealing = None  # found again, now without bwrap
    with caplog.at_level(logging.INFO):
        await host.agents.start()
    with pytest.raises(RpcError) as caught:
        await _new(host, "team-a", "/w")
    reason = "agent 'plain' is not run: it must run sealed and bwrap (bubblewrap) is not installed"
    assert caught.value.message == reason
    assert not host.agents.processes()
    assert reason in caplog.text  # at start-up too, in one line
    lines, healthy = await report(load_settings(None, sandbox="on", agents=[plain_agent()]))
    assert not healthy and f"agent plain: REFUSED: {reason}" in lines


async def test_auto_without_bwrap_runs_agents_unsealed_and_says_so_once(
    node: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    host = _host(node)
    host.agents.sealer._sealing = None
    with caplog.at_level(logging.INFO):
        await host.agents.start(prestart=False)
    await _new(host, "team-a", "/w")
    assert host.agents.processes()[0].argv == plain_agent().command
    warned = [r for r in caplog.records if "UNSEALED" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "bwrap (bubblewrap) is not installed" in warned[0].getMessage()


@pytest.mark.parametrize("node", [{"sandbox": "off"}], indirect=True)
async def test_sandbox_off_runs_agents_unsealed_and_says_so(
    node: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    host = _host(node)
    with caplog.at_level(logging.INFO):
        await host.agents.start(prestart=False)
    await _new(host, "team-a", "/")
    assert host.agents.processes()[0].argv == plain_agent().command


def test_sealed_command_lines_cover_hidden_files(tmp_path: Path) -> None:
    (tmp_path / "conf.toml").write_text("secret")
    (tmp_path / "archive").mkdir()
    hidden = (str(tmp_path / "conf.toml"), str(tmp_path / "archive"), "/elsewhere/key.pem")
    plan = SandboxPlan("/usr/bin/bwrap", 1 << 20, hidden)
    argv = plan.command(["agent"], [str(tmp_path)], network=False)
    joined = " ".join(argv)
    assert f"--ro-bind /dev/null {tmp_path}/conf.toml" in joined
    assert f"--tmpfs {tmp_path}/archive" in joined
    assert "/elsewhere" not in joined  # not in any visible tree: nothing to cover
    assert "--unshare-net" in argv and "--die-with-parent" in argv and "--new-session" in argv
    assert argv[-2:] == ["--", "agent"]


def test_secrets_are_read_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url_file = tmp_path / "url"
    url_file.write_text("redis://:pw@127.0.0.1:6390/0\n")
    secret_file = tmp_path / "jwt"
    secret_file.write_text("j" * 40)
    monkeypatch.setenv("ACP_BROKER_REDIS_URL_FILE", str(url_file))
    toml = tmp_path / "broker.toml"
    toml.write_text(
        f'jwt_secret_file = "{secret_file}"\nsandbox_hidden_paths = ["/etc/acp-broker.env"]\n'
    )
    settings = load_settings(str(toml))
    assert "/etc/acp-broker.env" in settings.hidden_paths()
    assert settings.redis_url == "redis://:pw@127.0.0.1:6390/0"
    assert settings.jwt_secret == "j" * 40
    assert {str(url_file), str(secret_file), str(toml)} <= set(settings.hidden_paths())
    monkeypatch.setenv("ACP_BROKER_REDIS_URL_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="redis_url_file: cannot read"):
        load_settings(None)


async def test_a_password_on_the_command_line_works_and_is_warned_about_once(
    tmp_path: Path,
) -> None:
    url_file = tmp_path / "url"
    url_file.write_text("redis://:pw@127.0.0.1:1/0")
    code, _, err = await run_cli("sessions", "--redis-url", "redis://:pw@127.0.0.1:1/0")
    assert code == 1 and err.count("a secret given as --redis-url") == 1
    assert "pw" not in err.replace("password", "")  # masked where the store is named
    code, _, err = await run_cli("sessions", "--redis-url-file", str(url_file))
    assert code == 1 and "a secret given" not in err and "127.0.0.1:1" in err


async def test_doctor_says_how_agents_run() -> None:
    code, out, _ = await asyncio.wait_for(run_cli("doctor"), 60)
    assert code == 0
    assert "agents run sealed by bubblewrap" in out
    assert "agent demo: sealed, network on, a process per tenant" in out
