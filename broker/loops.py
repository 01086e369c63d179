"""The event loop a broker process runs on.

uvloop (libuv, in C) runs the same asyncio code with less CPU per wake-up, per socket read
and per write than the standard library's loop: a front answering ``session/list`` spends
a fifth less CPU a request (``python -m bench requests``). It is a dependency wherever it
builds; ``event_loop = "asyncio"`` (``ACP_BROKER_EVENT_LOOP``) keeps the standard loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")
LoopChoice = Literal["auto", "uvloop", "asyncio"]

log = logging.getLogger(__name__)


def loop_factory(choice: LoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop ``choice`` names (None: the standard library's).

    ``uvloop`` when it is not installed is an error; ``auto`` then falls back quietly.
    """
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("event_loop is uvloop, but uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: LoopChoice = "auto") -> T:
    """``asyncio.run(main)`` on the chosen event loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        loop = runner.get_loop()
        log.info("event loop: %s", type(loop).__module__.split(".")[0])
        return runner.run(main)
