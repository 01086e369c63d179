"""How a request is answered: what a method returns besides its result.

A request is answered in one of three ways, which :class:`~.intake.Intake` settles in one
place (``Intake._settle``):

- a result, now: in the step that read the request (a method's :data:`StepAnswer`: a
  page the front keeps, a reconnecting client's ``initialize``) or at the end of its task;
- :class:`PendingRead`: a store read sent in this step, whose done callback makes the
  result (no task; bounded by the read's own timer);
- :class:`InTask`: the request needs a task (awaits); from a :data:`StepAnswer` or a
  :class:`PendingRead` that could not answer, it runs with what is left of its deadline.

Handlers that must order their reply against the session's events (``session/new``,
``load``, ``resume``, ``set_title``) send the reply themselves and return
:data:`DEFERRED`, so that the connection sends nothing more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


class Deferred:
    """A handler result meaning: the handler has sent (or will send) the reply itself."""


DEFERRED = Deferred()


@dataclass(frozen=True, slots=True)
class InTask:
    """The request is answered in a task: by ``work`` (a coroutine function: its result is
    the request's), or (None) dispatched to its method as any other."""

    work: Callable[[], Awaitable[Any]] | None = None


IN_TASK = InTask()
"""Dispatched to its method in a task, as any request that needs to wait."""


@dataclass(frozen=True, slots=True)
class PendingRead:
    """A store read sent for a request, answered in its done callback with no task: bounded
    in time by a timer of its own (``future``: cancelled when the request is, or the
    connection closes); ``finish`` makes the answer of the done future (a result, or an
    :class:`InTask`; raises ``RpcError`` to refuse)."""

    future: asyncio.Future[Any]
    finish: Callable[[asyncio.Future[Any]], Any]
    in_step: Callable[[asyncio.Future[Any], Callable[[Any], None]], None] | None = None
    """Given the future and its done callback: has that run in the step that reads the
    reply, not on the loop's next turn (see :meth:`~broker.store.raw.RawConnection.in_step`)."""


StepAnswer = Callable[[Any, Any], Any]
"""A method's answer in the step that read the request, given the connection and the
request: its result, a :class:`PendingRead` or an :class:`InTask` (raises ``RpcError``
to refuse)."""
