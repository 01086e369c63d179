"""The event loop a broker process runs on: uvloop where it is installed, else the standard
library's.

uvloop (libuv, in C; installed with acp-broker wherever it has wheels, not on Windows) runs
the same code with less CPU per wake-up, socket read and write. Measured side by side with
the standard loop (``ACP_BROKER_EVENT_LOOP=asyncio`` and ``=uvloop``): a front answering
``session/list`` spends a fifth less CPU a request (``python -m bench requests``: 134 → 108
µs of user CPU), admits a burst of 10,000 new connections at 801-864 a second instead of 692-704
(``bench connections``), and spends less CPU per delivered event in 5 of the 6 fan-out cells
(``bench fanout``). ``event_loop = "asyncio"`` keeps the standard loop; ``"uvloop"`` insists
on uvloop (an error where it is missing); ``"auto"``, the default, takes uvloop when it can.

uvloop once admitted bursts of connections slower, and some clients gave up: the listening
socket's accept queue (asyncio's default of 100) overflowed. Fronts now listen with the
kernel's largest backlog (:mod:`broker.front.node`), on either loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")
LoopChoice = Literal["auto", "asyncio", "uvloop"]

log = logging.getLogger(__name__)


def resolve(choice: LoopChoice) -> Literal["asyncio", "uvloop"]:
    """The loop ``choice`` means here: ``auto`` is uvloop where it is installed."""
    if choice != "auto":
        return choice
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def loop_factory(choice: LoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop ``choice`` names (None: the standard library's)."""
    if resolve(choice) == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        raise SystemExit(
            "event_loop is uvloop, but uvloop is not installed: pip install uvloop"
        ) from None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: LoopChoice = "auto") -> T:
    """``asyncio.run(main)`` on the chosen event loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        loop = runner.get_loop()
        log.info("event loop: %s", type(loop).__module__.split(".")[0])
        return runner.run(main)


async def cancel_and_wait(*tasks: asyncio.Task[Any], every: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling those still running again
    every ``every`` seconds: a cancellation that lands while redis-py's own read timeout
    fires can be taken for that timeout (``asyncio.timeout`` uncancels), and a loop that
    retries on errors would then go on for ever (a stop that cancelled once and waited hung
    a test's teardown for 300 s)."""
    running = {task for task in tasks if not task.done()}
    while running:
        for task in running:
            task.cancel()
        _, running = await asyncio.wait(running, timeout=every)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s ended with %r while stopping", task.get_name(), task.exception())


async def stop_within(name: str, stopping: Coroutine[Any, Any, None], timeout: float) -> bool:
    """Await ``stopping`` (a part's stop) for at most ``timeout`` seconds. A stop that takes
    longer is abandoned, and logged as an error with the stack of every task still pending,
    so that a stuck shutdown ends and says where it was stuck. False if it was abandoned."""
    try:
        await asyncio.wait_for(stopping, timeout)
    except TimeoutError:
        log.error(
            "%s did not stop within %.0f s; abandoned. Pending tasks:\n%s",
            name,
            timeout,
            pending_stacks(),
        )
        return False
    return True


def pending_stacks() -> str:
    """Where every pending task of the running loop is waiting, as text."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.print_stack(limit=8, file=out)
    return out.getvalue()
