"""A prompt runs once per prompt id, however many copies of its command reach the host.

A front sends a command again when its acknowledgement comes late (a loaded host, Redis
failing over or resharding), and sends a prompt again under the same prompt id when it
believes the host that took it lost it; so one prompt's command can reach the host that
holds its session twice, while its first copy waits in the queue, runs, or after it
ended. A copy must not queue (and run) the prompt a second time: it waits for the first
copy's outcome and is answered alike (the same result and end position, or the same
error). Ended prompts' outcomes are kept for :data:`KEPT_ENDED` prompts per session, far
more than a front sends again within its route deadline.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from broker.protocol.commands import PromptOutcome
from broker.protocol.jsonrpc import INTERNAL_ERROR, RpcError

KEPT_ENDED = 64
"""How many ended prompts' outcomes a held session keeps for late copies."""

_STOPPED = "the prompt was stopped on its agent host before it ended; send it again"


class PromptCopies:
    """The outcomes, as futures, of the prompts a held session took: waiting, running or
    recently ended, by prompt id."""

    def __init__(self) -> None:
        self._outcomes: OrderedDict[str, asyncio.Future[PromptOutcome]] = OrderedDict()

    def first(self, prompt_id: str) -> asyncio.Future[PromptOutcome] | None:
        """Take ``prompt_id``: None when this is its first copy (run it, then
        :meth:`settle`), else the first copy's outcome to wait for."""
        known = self._outcomes.get(prompt_id)
        if known is not None:
            return known
        self._outcomes[prompt_id] = asyncio.get_running_loop().create_future()
        self._forget_old()
        return None

    def settle(self, prompt_id: str, ended: PromptOutcome | BaseException) -> None:
        """The first copy of ``prompt_id`` ended: with an outcome, or an error. One that was
        cancelled (its session let go, the host stopping) is forgotten, so a copy sent
        again runs it; copies waiting meanwhile fail, saying so."""
        future = self._outcomes.get(prompt_id)
        if isinstance(ended, BaseException) and not isinstance(ended, Exception):
            self._outcomes.pop(prompt_id, None)
            ended = RpcError(INTERNAL_ERROR, _STOPPED)
        if future is None or future.done():
            return
        if isinstance(ended, PromptOutcome):
            future.set_result(ended)
        else:
            future.set_exception(ended)
            future.exception()  # retrieved: a prompt no copy came for is not "unhandled"

    def _forget_old(self) -> None:
        """Keep every unended prompt and the last :data:`KEPT_ENDED` ended ones."""
        ended = [pid for pid, future in self._outcomes.items() if future.done()]
        for pid in ended[: max(0, len(ended) - KEPT_ENDED)]:
            del self._outcomes[pid]
