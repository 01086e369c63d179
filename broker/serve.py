"""``acp-broker serve``: every role in one process, so one node works out of the box.

A :class:`Broker` composes the roles: a :class:`~broker.front.node.FrontNode` and, unless
the settings say ``workers = false`` (``--no-workers``), an agent host
(:class:`~workers.agent_host.worker.HostWorker`) and a projector
(:class:`~workers.projector.role.ProjectorRole`) beside it. Each role is an async context
manager whose loops run in a task group (:class:`~broker.lifetimes.RoleLoops`); the front
starts the others after its fan-out and stops them before it (its ``colocated`` roles), and
its readiness checks each role's loops. This module is where roles are put together; the
roles themselves never import each other.
"""

from __future__ import annotations

import logging
from typing import Any

from workers.agent_host.worker import HostWorker
from workers.projector.role import ProjectorRole

from .collector import FreezeSurvivors
from .config import Settings
from .front.http.app import http_url
from .front.node import FrontNode
from .logs import start_line
from .signals import until_stopped
from .store.client import Store, masked_url

log = logging.getLogger(__name__)


class Broker:
    """One broker process: a front node plus, by default, an agent host and a projector."""

    def __init__(self, settings: Settings, *, redis: Store | None = None) -> None:
        self.front = FrontNode(settings, redis=redis)
        self.worker: HostWorker | None = None
        self.projector: ProjectorRole | None = None
        if settings.workers:
            front = self.front
            self.worker = HostWorker(front.redis, settings, archive=front.archive)
            self.projector = ProjectorRole(front.redis, settings, archive=front.archive)
            # Started in this order and stopped in reverse: the host hands its sessions
            # over while the projector (and the archiving role) still runs.
            front.colocated += [self.projector, self.worker]
            front.health.add("projector loop", self.projector.loops.check)
            front.health.add("agent host loops", self.worker.role_loops.check)

    def __getattr__(self, name: str) -> Any:
        """What the front node offers (its ports, store, log, connections, health …): the
        broker is reached as its front is."""
        if name == "front":  # not set yet (__init__ failed early): no recursion
            raise AttributeError(name)
        return getattr(self.front, name)

    async def start(self) -> None:
        await self.front.start()

    async def stop(self, *, hand_over: bool = False) -> None:
        await self.front.stop(hand_over=hand_over)

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(hand_over=True)


async def run_broker(settings: Settings) -> None:
    """Run a broker until SIGINT or SIGTERM."""
    roles = ["front"] + (["agent host", "projector"] if settings.workers else [])
    agents = [spec.name for spec in settings.agent_list()]
    log.info("%s", start_line("serve", masked_url(settings.redis_url), roles, agents))
    async with Broker(settings) as broker:
        # What start-up made (modules, settings, the app) lives as long as the process: keep
        # it out of the collector's way, so that a full collection, which bursts of events
        # set off, walks only what the traffic made (a 10,000-event replay: 24k -> 37k
        # events/s); and what each full collection leaves, so that the next walks only what
        # came since (a burst of 10,000 connections: 1.0 s of collections, see
        # broker/collector.py). The whole heap is swept only once the heap per open
        # connection has doubled.
        collector = FreezeSurvivors(lambda: len(broker.front.connections))
        collector.start()
        print(
            f"acp-broker ready on ws://{settings.host}:{broker.front.port}{settings.path}"
            f" and {http_url(settings, broker.front.http_port)} (MCP /mcp, REST /v1/sessions)",
            flush=True,
        )
        await until_stopped()
        await collector.stop()
