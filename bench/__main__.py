"""``python -m bench [fanout|list|append|connections|replay|console] [--quick] …``: run them.

With no name, runs them all in turn (each with the options given). ``python -m bench
requests`` breaks ``list`` down: what one request costs a front, what one Redis call costs;
``python -m bench cluster`` times logging batches of events on a Redis Cluster, ``python -m
bench batchargs`` alone on one server (CPU and Redis time per event);
``python -m bench archive`` what a session costs Redis hot and archived; ``python -m bench
storm`` a front killed under thousands of connections, which all resume on another;
``python -m bench c50k`` 50,000 idle connections on one front (memory each, a fan-out
beside them); ``python -m bench sessionmem`` what a session followed by a connection costs
its front; ``python -m bench idle [--cluster]`` what an idle broker sends its Redis,
command by command; ``python -m bench agents`` what an agent process per tenant costs
(memory each, a first prompt's wait), sealed and unsealed; ``python -m bench http``
deliveries over Streamable HTTP beside WebSocket ones (CPU per delivery, p99, at a rate and
at max).
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "fanout": "bench.fanout",
    "list": "bench.listing",
    "append": "bench.append",
    "connections": "bench.connections",
    "replay": "bench.replay",
    "console": "bench.console",
}
BREAKDOWNS = {
    "requests": "bench.requests",
    "cluster": "bench.cluster",
    "projector": "bench.projector",
    "archive": "bench.archive",
    "storm": "bench.storm",
    "c50k": "bench.c50k",
    "batchargs": "bench.batch_args",
    "sessionmem": "bench.session_memory",
    "idle": "bench.idle",
    "agents": "bench.agent_cost",
    "http": "bench.http",
}
"""Run by name only, not with the six."""


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and not argv[0].startswith("-"):
        name, rest = argv[0], argv[1:]
        known = {**BENCHMARKS, **BREAKDOWNS}
        if name not in known:
            print(f"unknown benchmark {name!r}; one of {', '.join(known)}", file=sys.stderr)
            return 2
        importlib.import_module(known[name]).main(rest)
        return 0
    for module in BENCHMARKS.values():
        importlib.import_module(module).main(list(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
