"""What a process per tenant costs: memory per agent process, and a first prompt's wait.

An agent host (in this process, on the embedded store) runs ``--tenants`` tenants' sessions
of the plain test agent (``tests/agents/plain_agent.py``: Python and the ACP SDK, as small as
an agent gets), sealed (``sandbox = "on"``, bubblewrap) and unsealed (``off``), in turn. For
each tenant: a session is made and prompted on a process that does not exist yet (the
*first prompt*: the process started, sealed or not, ``initialize``, ``session/new``, the
prompt's turn), then a second session of the same tenant is made and prompted (*a later
one*: the process is there). Then every agent process's memory is read with its whole tree
(a sealed agent is ``bwrap``, the sandbox's first process and the agent): USS (what stopping
it would give back) and PSS (its share of what it shares).

    python -m bench agents --tenants 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench import common
from broker.config import AgentSpec, load_settings
from broker.serve import Broker
from broker.store.client import connect

PLAIN = Path(__file__).resolve().parent.parent / "tests" / "agents" / "plain_agent.py"
PROMPT = {"prompt": [{"type": "text", "text": "hello"}]}


def _tree_memory(pid: int) -> tuple[int, int]:
    """(USS, PSS) in bytes of ``pid`` and every process under it."""
    root = psutil.Process(pid)
    uss = pss = 0
    for proc in [root, *root.children(recursive=True)]:
        info = proc.memory_full_info()
        uss += info.uss
        pss += getattr(info, "pss", 0)
    return uss, pss


async def _turn(node: Broker, tenant: str) -> float:
    """Milliseconds for a new session and its first prompt's turn."""
    assert node.worker is not None
    host = node.worker.host
    began = time.perf_counter()
    params = {"cwd": f"/bench/{tenant}", "mcpServers": []}
    session_id, _ = await host.new_session(
        tenant, params, agent="plain", kind="shell", meta={}, origin="bench"
    )
    outcome = await host.prompt(tenant, session_id, PROMPT, "bench")
    assert outcome.result.get("stopReason") == "end_turn", outcome.result
    return (time.perf_counter() - began) * 1000


async def measure(sandbox: str, tenants: int) -> dict[str, Any]:
    agent = AgentSpec(name="plain", command=[sys.executable, str(PLAIN)])
    settings = load_settings(
        None,
        port=0,
        http_port=0,
        agents=[agent],
        sandbox=sandbox,
        prestart_agents=False,
        agent_idle_timeout=None,
        cursor_secret="bench",
    )
    node = Broker(settings, redis=connect(None))
    await node.start()
    try:
        assert node.worker is not None
        first, later = [], []
        for i in range(tenants):
            first.append(await _turn(node, f"tenant-{i}"))
            later.append(await _turn(node, f"tenant-{i}"))
        processes = node.worker.host.agents.processes()
        memory = [_tree_memory(p.pid) for p in processes if p.pid is not None]
    finally:
        await node.stop()
    return {
        "sandbox": sandbox,
        "processes": len(processes),
        "first_prompt_ms": first,
        "later_prompt_ms": later,
        "uss_bytes": [uss for uss, _ in memory],
        "pss_bytes": [pss for _, pss in memory],
    }


async def run(args: argparse.Namespace) -> None:
    results = [await measure(mode, args.tenants) for mode in args.modes]
    mib = 1024 * 1024
    rows = [
        [
            got["sandbox"],
            got["processes"],
            common.median(got["uss_bytes"]) / mib,
            common.median(got["pss_bytes"]) / mib,
            common.median(got["first_prompt_ms"]),
            max(got["first_prompt_ms"]),
            common.median(got["later_prompt_ms"]),
        ]
        for got in results
    ]
    text = common.table(
        f"An agent process per tenant ({args.tenants} tenants, the plain test agent)",
        [
            "sandbox",
            "processes",
            "USS MiB each",
            "PSS MiB each",
            "first prompt ms (median)",
            "first prompt ms (max)",
            "later prompt ms (median)",
        ],
        rows,
    )
    data = {**vars(args), "results": results}
    data.pop("out", None)
    common.report("agents", [text], data, args.out)


def main(argv: list[str] | None = None) -> None:
    p = common.parser("agents", (__doc__ or "").splitlines()[0])
    p.add_argument("--tenants", type=int, default=10, help="tenants, a process each")
    p.add_argument(
        "--modes", nargs="+", default=["off", "on"], choices=["off", "on"], help="sandbox modes"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.tenants = min(args.tenants, 2)
    os.environ.setdefault("ACP_DEMO_CHUNK_DELAY", "0")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
