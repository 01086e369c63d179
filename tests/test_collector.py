"""The server's collector policy: survivors frozen, the whole heap swept once the heap per
connection has doubled."""

from __future__ import annotations

import gc
import sys
import weakref

from broker.collector import FreezeSurvivors

from .support.client import wait_for


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


async def test_full_collections_freeze_their_survivors_and_a_sweep_finds_frozen_garbage() -> None:
    collector = FreezeSurvivors(check_every=3600)
    collector.start()
    try:
        assert collector._on_collection in gc.callbacks
        kept = _Node()
        gc.collect()  # a full collection: what survived it is frozen
        assert gc.get_freeze_count() > 0
        gone = weakref.ref(kept)
        del kept  # now cyclic garbage among frozen objects
        gc.collect()
        assert gone() is not None  # a full collection no longer walks frozen objects
        collector.sweep()
        assert gone() is None and collector.sweeps == 1
        assert gc.get_freeze_count() > 0  # the sweep's survivors are frozen again
    finally:
        await collector.stop()
        gc.unfreeze()
    assert collector._on_collection not in gc.callbacks


async def test_what_outlives_a_middle_generation_collection_is_frozen() -> None:
    collector = FreezeSurvivors(check_every=3600)
    collector.start()
    switch = sys.getswitchinterval()
    try:
        # The counts are read with no other thread let in between (under pytest-xdist, the
        # worker's channel thread runs beside the test and frees frozen objects of its own).
        sys.setswitchinterval(60.0)
        gc.unfreeze()
        kept = [_Node() for _ in range(100)]
        before = gc.get_freeze_count()
        gc.collect(1)  # a young collection of the middle generation: its survivors frozen
        frozen = gc.get_freeze_count()
        more = [_Node() for _ in range(100)]
        gc.collect(0)  # the youngest alone: its survivors move on, unfrozen
        after = gc.get_freeze_count()
        sys.setswitchinterval(switch)
        assert frozen >= before + len(kept)
        assert after == frozen and len(more) == 100
    finally:
        sys.setswitchinterval(switch)
        await collector.stop()
        gc.unfreeze()


async def test_a_sweep_comes_once_the_heap_per_connection_has_doubled() -> None:
    open_connections = [10_000]
    collector = FreezeSurvivors(lambda: open_connections[0], check_every=0.01)
    collector.start()
    try:
        # Clients joining grow the heap with the connections: no sweep.
        kept = [_Node() for _ in range(10_000)]
        open_connections[0] = 20_000
        assert not collector.due()
        # The same heap over far fewer connections (garbage left behind, say): a sweep.
        open_connections[0] = 1_000
        assert collector.due()
        await wait_for(lambda: collector.sweeps == 1, 5, "a sweep")
        assert not collector.due() and collector.sweeps == 1 and len(kept) == 10_000
    finally:
        await collector.stop()
        gc.unfreeze()
