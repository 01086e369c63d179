"""In-process front nodes (a :class:`FrontNode`, or a :class:`Broker` with its roles) run
for the length of a block, and what to wait for in them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from prometheus_client import REGISTRY

from broker.front.node import FrontNode
from broker.front.pages import PageCache
from broker.protocol.presence import changes_of
from broker.serve import Broker
from broker.store.client import connect

from .client import wait_for

NodeT = TypeVar("NodeT", FrontNode, Broker)


@contextlib.asynccontextmanager
async def running_front(node: NodeT) -> AsyncIterator[NodeT]:
    """``node`` started until the block ends, stopped however it ends. A node with a page
    cache is handed over once the cache is subscribed: before that it caches nothing, and a
    test of hits would race the subscription."""
    await node.start()
    try:
        if node.pages is not None:
            await wait_for(lambda: node.pages is not None and node.pages.live)
        yield node
    finally:
        await node.stop()


@contextlib.asynccontextmanager
async def broker_pair(redis_url: str, **settings: Any) -> AsyncIterator[list[Broker]]:
    """Two broker nodes (front and agent host each) on one real Redis, with ``settings``
    (the tests' defaults otherwise), until the block ends."""
    from ..conftest import make_settings  # the tests' settings (conftest imports no support)

    nodes: list[Broker] = []
    try:
        for _ in range(2):
            node = Broker(make_settings(**settings), redis=connect(redis_url))
            nodes.append(node)
            await node.start()
        yield nodes
    finally:
        for node in nodes:
            await node.stop()
            await node.redis.aclose()


def holding(cache: PageCache, count: int) -> Callable[[], bool]:
    """A condition to wait for: ``cache`` holds ``count`` pages."""
    return lambda: len(cache) == count


def invalidations() -> float:
    """How many times the fronts' page caches in this process dropped a tenant's pages."""
    return REGISTRY.get_sample_value("acp_broker_page_cache_invalidations_total") or 0.0


def asked_of_the_cache() -> dict[str, float]:
    """The pages asked of the fronts' caches in this process so far, by outcome (its
    metrics: ``hit``, ``miss``, ``bypass``)."""
    return {
        outcome: REGISTRY.get_sample_value("acp_broker_page_cache_total", {"outcome": outcome})
        or 0.0
        for outcome in ("hit", "miss", "bypass")
    }


async def all_left(node: Broker, session_id: str) -> bool:
    """Whether every window that attached to the session has left it, as its log says (a
    ``presence`` event ``left`` for each ``joined``): what a test that compares logs waits
    for once its windows closed, since the fronts log presence changes after the fact."""
    events = await node.log.read(node.settings.tenant, session_id)
    changes = [c["change"] for e in events if e.type == "presence" for c in changes_of(e.body)]
    return changes.count("joined") == changes.count("left")
