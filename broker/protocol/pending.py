"""Requests this side sent and is waiting on: id allocation and correlation."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from .jsonrpc import RequestId, Response, RpcError


class PeerGone(Exception):
    """The peer went away (or was given up on) before it answered."""


class PendingRequests:
    """Allocates request ids and resolves the futures that wait for their replies."""

    def __init__(self, first: int = 1) -> None:
        """``first``: the first id given out."""
        self._ids = itertools.count(first)
        self._waiting: dict[RequestId, asyncio.Future[Any]] = {}

    def open(self) -> tuple[int, asyncio.Future[Any]]:
        """A fresh id and the future its reply will resolve."""
        msg_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = future
        return msg_id, future

    def discard(self, msg_id: RequestId) -> None:
        self._waiting.pop(msg_id, None)

    def resolve(self, response: Response) -> bool:
        """Settle the request ``response`` answers; False if nobody waits for it."""
        future = self._waiting.pop(response.id, None)
        if future is None or future.done():
            return False
        if response.error is not None:
            err = response.error
            code = err.get("code")
            if not isinstance(code, int) or isinstance(code, bool):
                code = -32603
            future.set_exception(RpcError(code, str(err.get("message", "")), err.get("data")))
        else:
            future.set_result(response.result)
        return True

    def fail_all(self, reason: str) -> None:
        """Fail every waiting request: the peer is gone."""
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(PeerGone(reason))

    def __len__(self) -> int:
        return len(self._waiting)
