"""The environment an agent process starts with: an allow-list of the broker's, never all.

An agent runs tenants' prompts, and may run what they ask of it: whatever is in its
environment (``/proc/<pid>/environ``) a tenant can read. The broker's own environment
holds its secrets (``ACP_BROKER_JWT_SECRET``, ``ACP_BROKER_CURSOR_SECRET``, the Redis
URL with its password), so an agent gets only the variables the setting ``agent_env``
names, never an ``ACP_BROKER_*`` one, and its spec's own ``env`` on top.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

BROKER_PREFIX = "ACP_BROKER_"


def agent_environment(
    broker_env: Mapping[str, str], allowed: Iterable[str], own: Mapping[str, str]
) -> dict[str, str]:
    """The variables of ``broker_env`` that ``allowed`` names (``NAME`` or a ``PREFIX*``
    pattern), without the broker's settings, then ``own`` (the agent spec's ``env``)."""
    patterns = list(allowed)
    passed = {
        name: value
        for name, value in broker_env.items()
        if not name.startswith(BROKER_PREFIX)
        and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
    }
    return {**passed, **own}
