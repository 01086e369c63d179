"""Where a client library's errors become the store's own (:mod:`.errors`): the ports.

A port class is marked with :func:`port`, a port function with :func:`translated`: what the
client raises leaving it is raised again as the store's class for it (the client's error as
its ``__cause__``). Inside the store the client's classes go on flowing: its scripts fall
back on ``NOSCRIPT``, its retries and pipelines read them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ParamSpec, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, RedisError, ResponseError

from .errors import (
    StoreConnectionLost,
    StoreError,
    StoreForbidden,
    StoreFullError,
    StoreReadOnly,
    StoreReplyError,
    StoreUnavailable,
)
from .faults import is_noperm
from .log_errors import is_oom
from .retry import is_store_away

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound=type)


PORT_MARK = "__store_port__"
"""The attribute :func:`port` and :func:`translated` set (``tests/test_layout.py`` finds the
ports by it)."""


def store_error(exc: RedisError) -> StoreError:
    """The store's own class for the client's ``exc`` (its message kept)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ReadOnlyError):
        return StoreReadOnly(text)
    if is_oom(exc):
        return StoreFullError(text)
    if is_noperm(exc):
        return StoreForbidden(text)
    if is_store_away(exc):
        lost = isinstance(exc, RedisConnectionError)
        kind = StoreConnectionLost if lost else StoreUnavailable
        return kind(text if isinstance(exc, ResponseError) else f"{type(exc).__name__}: {text}")
    if isinstance(exc, ResponseError):
        return StoreReplyError(text)
    return StoreError(f"{type(exc).__name__}: {text}")


def translated(call: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """``call`` (a port's coroutine function) raising the store's classes for the client's."""

    @functools.wraps(call)
    async def port_call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await call(*args, **kwargs)
        except StoreError:  # the breaker's StoreAway, raised as the client's error too
            raise
        except RedisError as exc:
            raise store_error(exc) from exc

    setattr(port_call, PORT_MARK, True)
    return port_call


def _translated_iterator(
    call: Callable[P, AsyncIterator[T]],
) -> Callable[P, AsyncIterator[T]]:
    @functools.wraps(call)
    async def port_iterator(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        try:
            async for item in call(*args, **kwargs):
                yield item
        except StoreError:
            raise
        except RedisError as exc:
            raise store_error(exc) from exc

    setattr(port_iterator, PORT_MARK, True)
    return port_iterator


def port(cls: C) -> C:
    """Mark ``cls`` a port: each public coroutine (or async generator) method of its own
    raises the store's classes for the client's (:func:`translated`)."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if inspect.iscoroutinefunction(member):
            setattr(cls, name, translated(member))
        elif inspect.isasyncgenfunction(member):
            setattr(cls, name, _translated_iterator(member))
    setattr(cls, PORT_MARK, True)
    return cls
