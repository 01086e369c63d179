"""One request with an operation key, from its claim to its outcome: every front's way
through the operation ledger (:mod:`broker.store.operations`).

ACP mutations with an ``operationId`` (:mod:`.acp.operations`), REST mutations with an
``Idempotency-Key`` (``POST /v1/sessions`` among them: :mod:`.http.keyed`) and the MCP
mutation tools with an ``operationId`` (:mod:`.http.mcp`) all go through
:class:`OperationClaim`: :meth:`~OperationClaim.decide` claims the key (or says what holds
it: the first outcome, a conflict, a claim still running or lapsed); the request then runs
within :meth:`~OperationClaim.running`, which renews the claim's short lease while it runs,
so that a front killed mid-request leaves a claim a retry decides on within
:data:`LEASE_SECONDS`; and its outcome is settled (:meth:`~OperationClaim.settle`), fenced:
a request that lost its claim (stalled past its lease while a retry took the key over)
writes nothing. A request that ends with no outcome to keep lets the claim go when running
it again is safe (``repeatable``), else ends it unsettled (a retry hears the outcome is
unknown, or reads a prompt's from the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

from ..config import Settings
from ..errors.failures import describe
from ..store.client import Store
from ..store.operations import Claim, Entry, OperationKey, OperationLedger

log = logging.getLogger(__name__)

LEASE_SECONDS: Final = 10.0
"""How long a claim outlives its front's last renewal (renewed every third of it)."""


def ledger(redis: Store, settings: Settings) -> OperationLedger:
    """The operation ledger, with the settings' retention window and tombstone period."""
    return OperationLedger(
        redis, retention=settings.operation_retention, tombstone=settings.operation_tombstone
    )


class OperationClaim:
    """A request's claim of one operation key (see the module)."""

    def __init__(
        self,
        ledger: OperationLedger,
        key: OperationKey,
        fingerprint: str,
        *,
        repeatable: bool,
        lease: float = LEASE_SECONDS,
    ) -> None:
        self.ledger, self.key, self.fingerprint = ledger, key, fingerprint
        self.repeatable, self.lease = repeatable, lease
        self.held: Entry | None = None
        """This request's claim, as last written (None: it holds none, or it ended)."""
        self._lock = asyncio.Lock()  # a renewal and the settle never cross

    async def decide(self, wait: float) -> Entry:
        """Claim the key (``NEW``: run the request within :meth:`running`), or what holds
        it: ``DONE`` (the first outcome), ``CONFLICT``, ``FORGOTTEN`` (used before the
        retention window: its outcome is unknown) or ``PENDING`` (lapsed and not
        ``repeatable``: its outcome is unknown; or still running after ``wait`` seconds)."""
        entry = await self.ledger.decide(
            self.key, self.fingerprint, self.lease, repeatable=self.repeatable, wait=wait
        )
        if entry.claim is Claim.NEW:
            self.held = entry
        return entry

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The block runs the claimed request: the claim is renewed meanwhile, and a block
        that raises before :meth:`settle` ends it unsettled (:meth:`unsettled`)."""
        done = asyncio.Event()
        renewing = asyncio.ensure_future(self._renew(done))
        try:
            yield
        except BaseException:
            await self.unsettled()
            raise
        finally:
            done.set()
            await renewing  # ends at once, its renewal in flight finished (never cut mid-way)

    async def settle(self, outcome: Any) -> None:
        """The request came to ``outcome`` (JSON): every retry gets it (unless the claim
        was lost: logged; this request's caller still gets its own answer)."""
        async with self._lock:
            held, self.held = self.held, None
            if held is None:
                return
            if not await self.ledger.settle(self.key, self.fingerprint, outcome, held):
                log.warning("an operation's claim lapsed before its outcome was kept")

    async def unsettled(self) -> None:
        """The request ended with no outcome to keep: a ``repeatable`` one lets the claim
        go (a retry runs it), any other ends it now, unsettled."""
        async with self._lock:
            held, self.held = self.held, None
            if held is None:
                return
            end = self.ledger.forget if self.repeatable else self.ledger.lapse
            try:
                await asyncio.shield(end(self.key, held))
            except Exception as exc:  # the claim lapses by its lease instead
                log.warning("could not release an operation's claim: %s", describe(exc))

    async def _renew(self, done: asyncio.Event) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.lease / 3)
            async with self._lock:
                if done.is_set() or self.held is None:
                    return
                try:
                    renewed = await self.ledger.renew(self.key, self.held, self.lease)
                except Exception as exc:  # the next renewal tries again
                    log.warning("could not renew an operation's claim: %s", describe(exc))
                    continue
                if renewed is None:
                    log.warning("an operation's claim lapsed while its request ran")
                    self.held = None
                    return
                self.held = renewed
