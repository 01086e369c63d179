"""The event loop a broker process runs on: the standard library's, or uvloop.

uvloop (libuv, in C; ``pip install 'acp-broker[uvloop]'``, ``event_loop = "uvloop"``) runs
the same code with less CPU per wake-up, socket read and write: a front answering
``session/list`` spends a quarter less CPU a request (``python -m bench requests``). It is
not the default because a burst of new connections went slower on it: 10,000 clients
connecting at once were admitted at 358 a second instead of 507, and 44 of them gave up
(``python -m bench connections``, both loops in one sitting).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")
LoopChoice = Literal["asyncio", "uvloop"]

log = logging.getLogger(__name__)


def loop_factory(choice: LoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop ``choice`` names (None: the standard library's)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        raise SystemExit(
            "event_loop is uvloop, but uvloop is not installed: pip install 'acp-broker[uvloop]'"
        ) from None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: LoopChoice = "asyncio") -> T:
    """``asyncio.run(main)`` on the chosen event loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        loop = runner.get_loop()
        log.info("event loop: %s", type(loop).__module__.split(".")[0])
        return runner.run(main)
