"""Health that tells the truth: ``/livez`` (the process serves) and ``/readyz`` (it can do
its work now).

Readiness runs every check at once, each within ``timeout`` seconds: Redis answers a
``PING``, the pub/sub reader is subscribed and hears its own probes, the role's loops are
running. The answer is JSON with each check, ``200`` when all pass and ``503`` otherwise,
so a load balancer or Kubernetes takes a node that cannot serve out of rotation::

    {"status": "unavailable",
     "checks": {"redis": {"ok": false, "error": "TimeoutError: no reply within 2 s"},
                "pubsub": {"ok": true}, "loops": {"ok": true}}}

``/healthz`` is an alias of ``/readyz``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..errors.failures import describe
from ..logs import redact

LIVE_PATH = "/livez"
READY_PATH = "/readyz"
HEALTH_PATH = "/healthz"
"""An alias of :data:`READY_PATH` (what older probes ask)."""
HEALTH_PATHS = (LIVE_PATH, READY_PATH, HEALTH_PATH)

Check = Callable[[], Awaitable[str | None]]
"""A readiness check: returns when healthy (a note worth saying, or None), raises
:class:`Unhealthy` (or anything) if not."""


class Unhealthy(Exception):
    """A check failed; the message says why."""


@dataclass(frozen=True, slots=True)
class HealthAnswer:
    """A health endpoint's HTTP answer."""

    status: int
    body: bytes
    content_type: str = "application/json"


class Health:
    """The checks of one process, and the answers of its health endpoints."""

    def __init__(self, *, timeout: float = 2.0) -> None:
        self.timeout = timeout
        self.checks: dict[str, Check] = {}

    def add(self, name: str, check: Check) -> None:
        """Add (or replace) a readiness check."""
        self.checks[name] = check

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        """Run every check at once; whether all passed, and each one's outcome."""
        names = list(self.checks)
        outcomes = await asyncio.gather(*(self._run(self.checks[name]) for name in names))
        report = dict(zip(names, outcomes, strict=True))
        return all(outcome["ok"] for outcome in outcomes), report

    async def _run(self, check: Check) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):
                note = await check()
        except TimeoutError:
            return {"ok": False, "error": f"no answer within {self.timeout:g} s"}
        except Exception as exc:
            return {"ok": False, "error": redact(describe(exc))}
        outcome: dict[str, Any] = {
            "ok": True,
            "ms": round((time.perf_counter() - started) * 1000, 2),
        }
        if note:
            outcome["note"] = redact(note)
        return outcome

    async def answer(self, path: str) -> HealthAnswer | None:
        """The answer to a GET of ``path``; None when it is no health endpoint."""
        if path == LIVE_PATH:
            return _json(200, {"status": "ok"})
        if path in (READY_PATH, HEALTH_PATH):
            ok, checks = await self.ready()
            return _json(
                200 if ok else 503, {"status": "ok" if ok else "unavailable", "checks": checks}
            )
        return None


def _json(status: int, document: dict[str, Any]) -> HealthAnswer:
    return HealthAnswer(status, json.dumps(document, separators=(",", ":")).encode() + b"\n")
