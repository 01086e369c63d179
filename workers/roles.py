"""The worker roles as processes: run until SIGINT/SIGTERM, then stop cleanly.

With ``metrics_port`` set, a role also serves ``/metrics``, ``/livez`` and ``/readyz``
(:mod:`broker.ops.server`); its ready line says where.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from broker.config import Settings
from broker.logs import start_line
from broker.ops.health import Health
from broker.ops.server import OpsServer
from broker.signals import until_stopped
from broker.store.archive import open_archive
from broker.store.client import connect, masked_url
from broker.store.guard import StoreGuard

from .agent_host.worker import HostWorker
from .projector.role import ProjectorRole

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def _ops(settings: Settings, health: Health) -> AsyncIterator[str]:
    """The operator's port while the block runs; yields what the ready line adds."""
    if settings.metrics_port is None:
        yield ""
        return
    server = OpsServer(health, settings.host, settings.metrics_port)
    await server.start()
    try:
        yield f" (metrics on http://{settings.host}:{server.port}/metrics)"
    finally:
        await server.stop()


def _health(settings: Settings, guard: StoreGuard) -> Health:
    health = Health(timeout=settings.health_timeout)
    health.add("redis", guard.ready)
    return health


async def run_agent_host(settings: Settings) -> None:
    """An agent host; on SIGTERM it hands its sessions over to the other hosts."""
    agents = [spec.name for spec in settings.agent_list()]
    store = masked_url(settings.redis_url)
    log.info("%s", start_line("worker agent-host", store, ["agent host"], agents))
    redis = connect(settings.redis_url, timeout=settings.redis_timeout)
    guard = StoreGuard(redis, settings)
    await guard.start()  # a store that would lose data, or cannot be used, is refused here
    location = settings.archive_location()
    worker = HostWorker(redis, settings, archive=open_archive(location) if location else None)
    health = _health(settings, guard)
    health.add("agent host loops", worker.role_loops.check)
    async with _ops(settings, health) as where, worker:  # left: its sessions handed over
        print(f"acp-broker agent host {worker.host_id} ready{where}", flush=True)
        await until_stopped()
        log.info("agent host %s draining: handing its sessions over", worker.host_id)
    await guard.stop()
    await redis.aclose()


async def run_projector_role(settings: Settings) -> None:
    """A projector; several may run, they share the feeds through a consumer group. With an
    archive store configured it is also the archiving role (archive idle logs, purge)."""
    log.info(
        "%s", start_line("worker projector", masked_url(settings.redis_url), ["projector"], [])
    )
    redis = connect(settings.redis_url, timeout=settings.redis_timeout)
    guard = StoreGuard(redis, settings)
    await guard.start()  # a store that cannot be reached at start is an error, not "ready"
    location = settings.archive_location()
    archive = open_archive(location) if location is not None else None
    projector = ProjectorRole(redis, settings, archive=archive)
    health = _health(settings, guard)
    health.add("projector loops", projector.loops.check)
    async with _ops(settings, health) as where, projector:
        print(f"acp-broker projector ready{where}", flush=True)
        await until_stopped()
    await guard.stop()
    if archive is not None:
        await archive.close()
    await redis.aclose()
