"""``acp-broker serve``: every role in one process, so one node works out of the box.

A :class:`Broker` is a :class:`~broker.front.node.FrontNode` with, unless the
settings say ``workers = false`` (``--no-workers``), an agent host and a
projector beside it. This module is where roles are put together; the roles
themselves never import each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from workers.agent_host.worker import HostWorker
from workers.projector.archiving import archiving_role
from workers.projector.feeds import run_feed_trimming
from workers.projector.worker import configured_projector

from .collector import FreezeSurvivors
from .config import Settings
from .front.http.app import http_url
from .front.node import FrontNode
from .logs import start_line
from .loops import cancel_and_wait
from .ops.health import tasks_running
from .signals import until_stopped
from .store.client import Store, masked_url

log = logging.getLogger(__name__)


class Broker(FrontNode):
    """One broker process: a front node plus, by default, an agent host and a projector."""

    def __init__(self, settings: Settings, *, redis: Store | None = None) -> None:
        super().__init__(settings, redis=redis)
        self.worker: HostWorker | None = None
        if settings.workers:
            self.worker = HostWorker(self.redis, settings, archive=self.archive)
            # Started in this order and stopped in reverse: the host hands its sessions
            # over while the projector (and the archiving role) still runs.
            projector = LoopTask("projector", configured_projector(self.redis, settings).run)
            self.colocated.append(projector)
            self.health.add("projector loop", tasks_running(projector.loops))
            trimming = LoopTask(
                "feed trimming",
                lambda: run_feed_trimming(self.redis, settings.feed_trim_interval),
            )
            self.colocated.append(trimming)
            self.health.add("feed trimming loop", tasks_running(trimming.loops))
            if self.archive is not None:
                archive = self.archive
                archiving = LoopTask(
                    "archiving", lambda: archiving_role(self.redis, archive, settings)
                )
                self.colocated.append(archiving)
                self.health.add("archiving loop", tasks_running(archiving.loops))
            self.colocated.append(self.worker)
            self.health.add("agent host loops", tasks_running(self.worker.loops))


class LoopTask:
    """A role whose loop runs as a task of the node's loop (the projector, archiving)."""

    def __init__(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self.run = run
        self._task: asyncio.Task[None] | None = None

    def loops(self) -> list[asyncio.Task[None] | None]:
        return [self._task]

    async def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=self.name)

    async def stop(self, *, hand_over: bool = False) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)


async def run_broker(settings: Settings) -> None:
    """Run a broker until SIGINT or SIGTERM."""
    roles = ["front"] + (["agent host", "projector"] if settings.workers else [])
    agents = [spec.name for spec in settings.agent_list()]
    log.info("%s", start_line("serve", masked_url(settings.redis_url), roles, agents))
    broker = Broker(settings)
    await broker.start()
    # What start-up made (modules, settings, the app) lives as long as the process: keep it
    # out of the collector's way, so that a full collection, which bursts of events set off,
    # walks only what the traffic made (a 10,000-event replay: 24k -> 37k events/s); and
    # what each full collection leaves, so that the next walks only what came since (a
    # burst of 10,000 connections: 1.0 s of collections, see broker/collector.py). The whole
    # heap is swept only once the heap per open connection has doubled.
    collector = FreezeSurvivors(lambda: len(broker.connections))
    collector.start()
    print(
        f"acp-broker ready on ws://{settings.host}:{broker.port}{settings.path}"
        f" and {http_url(settings, broker.http_port)} (MCP /mcp, REST /v1/sessions)",
        flush=True,
    )
    await until_stopped()
    await collector.stop()
    await broker.stop(hand_over=True)
