"""The command line fails as an operator can read: one sentence and a non-zero exit, never a
traceback, when Redis cannot be reached or an argument is wrong; ``--version``; JSON logs
whose start line names the store (its password masked), the roles and the agents."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .support.broker_process import ROOT, broker_env
from .support.redis_server import free_port


def acp_broker(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**broker_env(), **(env or {})},
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
    )


def test_version() -> None:
    result = acp_broker("--version")
    assert result.returncode == 0 and result.stdout.startswith("acp-broker "), result


@pytest.mark.parametrize(
    "command",
    [
        ["sessions"],
        ["token", "list"],
        ["rebuild-index"],
        ["worker", "projector"],
        ["worker", "agent-host"],
        ["serve", "--port", "0", "--http-port", "0"],
    ],
)
def test_an_unreachable_redis_is_one_sentence_and_exit_1(command: list[str]) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    result = acp_broker(*command, "--redis-url", url)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("acp-broker ")]
    assert len(errors) == 1, result.stderr
    assert "cannot use the store at redis://:***@127.0.0.1" in errors[0], errors
    assert "ready" not in result.stdout


def test_wrong_arguments_are_one_sentence_and_exit_2() -> None:
    result = acp_broker("serve", "--agent", "no-equals-sign")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result
    assert "--agent takes NAME=" in result.stderr
    result = acp_broker("sessions", "--limit", "0")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result


def test_a_short_jwt_secret_is_refused_in_one_sentence_and_exit_2() -> None:
    # 31 bytes: one short of an HS256 key as long as its hash (RFC 7518, 3.2).
    short = "x" * 31
    result = acp_broker("serve", "--port", "0", env={"ACP_BROKER_JWT_SECRET": short})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result
    errors = [line for line in result.stderr.splitlines() if line.startswith("acp-broker ")]
    assert len(errors) == 1, result.stderr
    assert "jwt_secret: must be at least 32 bytes" in errors[0] and "it is 31" in errors[0]
    assert short not in result.stderr + result.stdout  # the secret itself is never echoed


def test_json_logs_and_the_start_line() -> None:
    result = acp_broker(
        "worker",
        "projector",
        "--redis-url",
        f"redis://:s3cret@127.0.0.1:{free_port()}/0",
        "--log-format",
        "json",
    )
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert lines and all({"ts", "level", "logger", "message"} <= set(e) for e in lines)
    [start] = [e for e in lines if "starting" in e["message"]]
    assert "store redis://:***@127.0.0.1" in start["message"]
    assert "roles: projector" in start["message"]
