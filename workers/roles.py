"""The worker roles as processes: run until SIGINT/SIGTERM, then stop cleanly."""

from __future__ import annotations

import asyncio
import logging

from broker.config import Settings
from broker.loops import cancel_and_wait
from broker.signals import until_stopped
from broker.store.archive import open_archive
from broker.store.client import connect

from .agent_host.worker import HostWorker
from .projector.archiving import archiving_role
from .projector.worker import Projector

log = logging.getLogger(__name__)


async def run_agent_host(settings: Settings) -> None:
    """An agent host; on SIGTERM it hands its sessions over to the other hosts."""
    redis = connect(settings.redis_url, timeout=settings.redis_timeout)
    location = settings.archive_location()
    worker = HostWorker(redis, settings, archive=open_archive(location) if location else None)
    await worker.start()
    print(f"acp-broker agent host {worker.host_id} ready", flush=True)
    await until_stopped()
    log.info("agent host %s draining: handing its sessions over", worker.host_id)
    await worker.stop(hand_over=True)
    await redis.aclose()


async def run_projector_role(settings: Settings) -> None:
    """A projector; several may run, they share the feeds through a consumer group. With an
    archive store configured it is also the archiving role (archive idle logs, purge)."""
    redis = connect(settings.redis_url, timeout=settings.redis_timeout)
    location = settings.archive_location()
    archive = open_archive(location) if location is not None else None
    tasks = [asyncio.create_task(Projector(redis).run())]
    if archive is not None:
        tasks.append(asyncio.create_task(archiving_role(redis, archive, settings)))
    print("acp-broker projector ready", flush=True)
    await until_stopped()
    for task in tasks:
        await cancel_and_wait(task)
    if archive is not None:
        await archive.close()
    await redis.aclose()
