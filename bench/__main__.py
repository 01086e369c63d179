"""``python -m bench [fanout|list|append|connections|replay] [--quick] …``: run the benchmarks.

With no name, runs them all in turn (each with the options given).
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
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and not argv[0].startswith("-"):
        name, rest = argv[0], argv[1:]
        if name not in BENCHMARKS:
            print(f"unknown benchmark {name!r}; one of {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
        importlib.import_module(BENCHMARKS[name]).main(rest)
        return 0
    for module in BENCHMARKS.values():
        importlib.import_module(module).main(list(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
