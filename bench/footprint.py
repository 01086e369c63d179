"""What a Redis holds, by key kind: ``MEMORY USAGE`` of every key, summed per kind.

The kinds are those of ``broker/store/keys.py`` (and ``docs/redis-memory.md``'s table):
a key's kind is read off its name. :func:`by_kind` walks the whole key space (``SCAN``),
so it is for benchmarks and operators' spot checks, not for a serving path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

TAKEN_MARKS = "taken marks"
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("session log", r"^acpb:\{p[^}]*\}:t:.*:s:[^:]*:log$"),
        ("session snapshot", r"^acpb:\{p[^}]*\}:t:.*:s:[^:]*:snap$"),
        ("session metadata", r"^acpb:\{p[^}]*\}:t:.*:s:[^:]*:meta$"),
        ("session lease", r"^acpb:\{p[^}]*\}:t:.*:s:[^:]*:lease$"),
        ("held leases (acpb:leases)", r"^acpb:leases$"),
        ("change feeds", r"^acpb:\{p[^}]*\}:feed$"),
        ("hot sets", r"^acpb:\{p[^}]*\}:hot$"),
        ("deleted sets", r"^acpb:\{p[^}]*\}:deleted$"),
        ("index rows", r"^acpb:\{t:[^}]*\}:rows$"),
        ("index versions", r"^acpb:\{t:[^}]*\}:ver$"),
        ("ACP listings", r"^acpb:\{t:[^}]*\}:ix:acp(:.*)?$"),
        ("catalog listings", r"^acpb:\{t:[^}]*\}:ix:c(:.*)?$"),
        ("host inboxes", r"^acpb:host:[^:]*:inbox$"),
        ("shared command queue", r"^acpb:hosts:queue$"),
        (TAKEN_MARKS, r"^acpb:hosts:taken:.*$"),
    )
)
OTHER = "other (tenants, capabilities, ...)"


def kind_of(key: str) -> str:
    """The kind of the key named ``key`` (:data:`OTHER` when no pattern matches)."""
    for name, pattern in KINDS:
        if pattern.match(key):
            return name
    return OTHER


async def by_kind(redis: Any) -> dict[str, tuple[int, int]]:
    """Every kind's (key count, ``MEMORY USAGE`` bytes, all elements sampled)."""
    found: dict[str, list[int]] = {}
    keys = [key async for key in redis.scan_iter(count=1000)]
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        async with redis.pipeline(transaction=False) as pipe:
            for key in chunk:
                pipe.memory_usage(key, samples=0)
            sizes = await pipe.execute()
        for key, size in zip(chunk, sizes, strict=True):
            name = key if isinstance(key, str) else key.decode()
            counts = found.setdefault(kind_of(name), [0, 0])
            counts[0] += 1
            counts[1] += int(size or 0)
    return {kind: (count, size) for kind, (count, size) in found.items()}


def difference(
    after: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """``after`` less ``before``, kind by kind (kinds of either)."""
    kinds: Iterable[str] = dict.fromkeys([*after, *before])
    return {
        kind: (
            after.get(kind, (0, 0))[0] - before.get(kind, (0, 0))[0],
            after.get(kind, (0, 0))[1] - before.get(kind, (0, 0))[1],
        )
        for kind in kinds
    }


def stats_difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, float]:
    """``MEMORY STATS``' numeric figures, ``after`` less ``before``."""
    return {
        name: after[name] - before.get(name, 0)
        for name, value in after.items()
        if isinstance(value, int | float) and isinstance(before.get(name, 0), int | float)
    }
