"""Fixtures: private Redis servers, brokers in-process or as real processes, clients."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import settings as hypothesis_settings

from broker.config import AgentSpec, load_settings
from broker.serve import Broker
from broker.store.client import connect

from .support.redis_server import redis_server

# The suite is the gate a change must pass: property tests draw the same examples on every
# run, so a run fails for what changed, not for the draw (`HYPOTHESIS_PROFILE=explore`
# draws afresh, to hunt). No per-example deadline: these machines are shared.
hypothesis_settings.register_profile("gate", derandomize=True, deadline=None)
hypothesis_settings.register_profile("explore", deadline=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))

# `make test` runs the suite on two pytest-xdist workers with `--dist loadgroup`: a test goes
# to whichever worker is free, except those of one group, which run one after another on one
# worker. "faults": the tests that kill or stall servers against deadlines, those that wait
# for a process with a tight bound (the bridge's 5 s), and those that load the machine (a
# storm of benchmarks, thousands of prompts), so that no two of them run at once (their
# deadlines hold beside light tests, not beside a storm). The others:
# modules whose module-scoped fixture (a browser, a PostgreSQL, a broker thread, a tracer
# provider, the SDK peers) is made once, on one worker.
XDIST_GROUPS = {
    "test_bench_smoke": "faults",
    "test_bridge": "faults",
    "test_bridge_e2e": "faults",
    "test_chaos": "faults",
    "test_cluster": "faults",
    "test_cluster_resharding": "faults",
    "test_cluster_breaker": "faults",
    "test_fail_fast": "faults",
    "test_many_threads": "faults",
    "test_pipelining": "faults",
    "test_split_recovery": "faults",
    "test_permission_roundtrip": "faults",
    "test_redis_faults": "faults",
    "test_restart": "faults",
    "test_scale_out": "faults",
    "test_sentinel": "faults",
    "test_shared_conformance": "faults",
    "test_archive_postgres": "postgres",
    "test_console": "console",
    "test_live_view": "console",
    "test_fuzz": "fuzz",
    "test_trace_context": "trace",
    "test_ts_sdk": "ts",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test of a module in ``XDIST_GROUPS`` with its ``xdist_group``."""
    for item in items:
        group = XDIST_GROUPS.get(item.path.stem)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _logging_kept() -> Iterator[None]:
    """Each test leaves logging as it found it. A test that runs the CLI in process sets the
    root logger's handler on the stream pytest captured for that test (``broker.logs.configure``);
    left there, every later test's log lines went to a closed file ("--- Logging error ---")."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    yield
    ours = [h for h in handlers if not _is_pytests(h)]
    for handler in [h for h in root.handlers if h not in ours and not _is_pytests(h)]:
        root.removeHandler(handler)
    for handler in [h for h in ours if h not in root.handlers]:
        root.addHandler(handler)
    root.setLevel(level)
    for name, logger_level in levels.items():
        logging.getLogger(name).setLevel(logger_level)


def _is_pytests(handler: logging.Handler) -> bool:
    """pytest's own capture handlers, which it adds and removes around each phase itself."""
    return type(handler).__module__.startswith("_pytest")


ROOT = Path(__file__).resolve().parent.parent
AGENTS = Path(__file__).resolve().parent / "agents"

TEST_SANDBOX = "off"
"""Agents run unsealed in tests but for the sandbox's own (``tests/test_sandbox*.py``): a
sealed process per set of session directories, started under a loaded machine's 3-5 s of
Python imports, would slow every test that makes sessions in several folders, and the demo
agent's ``ACP_DEMO_STATE_DIR`` would need to be one of its ``rw_paths``."""

DEMO_ENV = {"ACP_DEMO_TEST_COMMANDS": "1", "ACP_DEMO_CHUNK_DELAY": "0"}


def demo_agent(name: str = "demo", **env: str) -> AgentSpec:
    return AgentSpec(
        name=name,
        command=[sys.executable, "-m", "broker.demo.agent"],
        env={**DEMO_ENV, **env},
    )


def plain_agent(name: str = "plain") -> AgentSpec:
    return AgentSpec(
        name=name, command=[sys.executable, str(AGENTS / "plain_agent.py")], kind="shell"
    )


@pytest.fixture(scope="session")
def redis_url_session() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture
def redis_url(redis_url_session: str) -> str:
    """A real, empty Redis for this test."""
    with redis.Redis.from_url(redis_url_session) as client:
        client.flushall()
    return redis_url_session


@pytest.fixture(params=["redis", "embedded"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(store_kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A store client: a real Redis server, the embedded store, or (where a module asks for
    ``cluster`` or ``sentinel`` in its own ``store_kind``) a real Redis Cluster or the
    master of a real Sentinel set."""
    if store_kind == "redis":
        client = connect(request.getfixturevalue("redis_url"))
    elif store_kind == "cluster":
        client = connect(request.getfixturevalue("redis_cluster_info").url)
    elif store_kind == "sentinel":
        client = connect(request.getfixturevalue("redis_sentinel_url"))
    else:
        client = connect(None)
    yield client
    await client.aclose()


def make_settings(**overrides: Any) -> Any:
    overrides.setdefault("agents", [demo_agent(), plain_agent()])
    overrides.setdefault("prestart_agents", False)
    overrides.setdefault("sandbox", TEST_SANDBOX)
    return load_settings(None, port=0, cursor_secret="test-secret", **overrides)


@pytest.fixture
async def broker(store: Any) -> AsyncIterator[Broker]:
    """A broker node in this process, on the parametrized store."""
    node = Broker(make_settings(), redis=store)
    await node.start()
    yield node
    await node.stop()
    assert not node.stalled_stops, f"parts that did not stop (stacks logged): {node.stalled_stops}"


@pytest.fixture
def url(broker: Broker) -> str:
    return f"ws://127.0.0.1:{broker.port}/acp"


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


async def run_cli(*args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    """``python -m broker.cli ARGS`` as a user runs it (no ACP_BROKER_* settings inherited):
    its exit code, standard output and standard error."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("ACP_BROKER_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "broker.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture(scope="session")
def redis_cluster_session() -> Iterator[Any]:
    from .support.redis_cluster import redis_cluster

    with redis_cluster() as info:
        yield info


@pytest.fixture
def redis_cluster_info(redis_cluster_session: Any) -> Any:
    """A real 3-master Redis Cluster (with replicas), emptied for this test."""
    redis_cluster_session.wait_ok()
    for port in redis_cluster_session.ports:
        with redis_cluster_session.client(port) as node:
            if node.info("replication")["role"] == "master":
                node.flushall()
    return redis_cluster_session


@pytest.fixture(scope="session")
def redis_sentinel_session() -> Iterator[Any]:
    from .support.redis_sentinel import sentinel_set

    with sentinel_set() as sentinels:
        yield sentinels


@pytest.fixture
def redis_sentinel_url(redis_sentinel_session: Any) -> str:
    """The ``redis+sentinel://`` URL of a real Sentinel set (1 master, 1 replica, 3
    Sentinels), its master emptied for this test."""
    with redis_sentinel_session.master() as master:
        master.flushall()
    return str(redis_sentinel_session.url())
