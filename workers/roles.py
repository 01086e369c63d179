"""The worker roles as processes: run until SIGINT/SIGTERM, then stop cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from broker.config import Settings
from broker.signals import until_stopped
from broker.store.client import connect

from .agent_host.worker import HostWorker
from .projector.worker import Projector

log = logging.getLogger(__name__)


async def run_agent_host(settings: Settings) -> None:
    """An agent host; on SIGTERM it hands its sessions over to the other hosts."""
    redis = connect(settings.redis_url)
    worker = HostWorker(redis, settings)
    await worker.start()
    print(f"acp-broker agent host {worker.host_id} ready", flush=True)
    await until_stopped()
    log.info("agent host %s draining: handing its sessions over", worker.host_id)
    await worker.stop(hand_over=True)
    await redis.aclose()


async def run_projector_role(settings: Settings) -> None:
    """A projector; several may run, they share the feeds through a consumer group."""
    redis = connect(settings.redis_url)
    task = asyncio.create_task(Projector(redis).run())
    print("acp-broker projector ready", flush=True)
    await until_stopped()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await redis.aclose()
