"""``Idempotency-Key`` on every REST mutation: a retried request gets the first response.

A mutation (``DELETE /v1/sessions/{id}``, ``POST …/prompt``, ``…/cancel``, ``…/resume``,
``…/stop``) sent with an ``Idempotency-Key`` header runs once per key: the key is an
operation id in the operation ledger (:mod:`broker.store.operations`), per tenant, with the
request's method, path and body as its input. A retry with the same key and input is
answered with the first response (status and body, marked ``Idempotent-Replayed: true``);
with another input, ``operation_conflict`` (409). A response the broker failed with (5xx)
is not kept: a retry runs. A retry that comes while the first still runs waits for it
(bounded). When the first request died without a response: a cancel, resume, stop or delete
(the same when run twice) runs again; a prompt is ``operation_outcome_unknown`` (409), and
nothing runs. ``POST /v1/sessions`` keeps its own keys (:mod:`.idempotency`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

from ...auth.principal import Scope
from ...config import Settings
from ...errors import ApiError
from ...errors.operations import rest_conflict, rest_outcome_unknown, rest_pending
from ...protocol.operations import digest
from ...store.client import Store
from ...store.operations import Claim, Entry, OperationKey, OperationLedger
from .idempotency import HEADER, checked_key
from .rest import problem

Endpoint = Callable[[Request], Awaitable[Response]]
Caller = Callable[[Request, Scope], Awaitable[str]]
REPLAYED: Final = "Idempotent-Replayed"
"""Header of a response that is the first request's, replayed."""
LEASE_MARGIN: Final = 5.0
REST_CLIENT: Final = "rest"
"""The client instance of REST callers' keys (keys are the tenant's, as for creates)."""


class KeyedMutations:
    """Wraps mutation endpoints with the ledger (see the module)."""

    def __init__(self, redis: Store, settings: Settings, caller: Caller) -> None:
        self.ledger = OperationLedger(redis)
        self.settings = settings
        self.caller = caller

    def keyed(self, endpoint: Endpoint, *, repeatable: bool, long: bool = False) -> Endpoint:
        """``endpoint`` (answering with problem documents) run once per ``Idempotency-Key``.
        ``repeatable``: running it twice comes out the same; ``long``: it may take a
        prompt's time."""
        bound = self.settings.prompt_timeout if long else self.settings.request_timeout

        async def run(request: Request) -> Response:
            header = request.headers.get(HEADER)
            if header is None:
                return await endpoint(request)
            try:
                tenant = await self.caller(request, Scope.WRITE)
                mutation = _Mutation(self.ledger, request, tenant, checked_key(header))
                mutation.fingerprint = digest(await _input(request))
                wait = self.settings.request_timeout
                return await mutation.run(endpoint, repeatable, bound + LEASE_MARGIN, wait)
            except ApiError as error:
                answer = problem(error)
                return Response(answer.body, answer.status, headers=dict(answer.headers))

        return run


class _Mutation:
    def __init__(self, ledger: OperationLedger, request: Request, tenant: str, key: str) -> None:
        self.ledger, self.request = ledger, request
        self.key = OperationKey(tenant, "", REST_CLIENT, key)
        self.fingerprint = ""

    async def run(
        self, endpoint: Endpoint, repeatable: bool, lease: float, wait: float
    ) -> Response:
        ledger, key = self.ledger, self.key
        entry = await ledger.decide(key, self.fingerprint, lease, repeatable=repeatable, wait=wait)
        if entry.claim is Claim.CONFLICT:
            raise rest_conflict()
        if entry.claim is Claim.DONE:
            return _replayed(entry.outcome)
        if entry.claim is Claim.PENDING:
            raise rest_outcome_unknown() if entry.lapsed else rest_pending()
        return await self._first(endpoint, entry, repeatable)

    async def _first(self, endpoint: Endpoint, entry: Entry, repeatable: bool) -> Response:
        try:
            response = await endpoint(self.request)
        except BaseException:
            await self._unsettled(entry, repeatable)
            raise
        if response.status_code >= 500:
            await self._unsettled(entry, repeatable)
            return response
        body = bytes(response.body).decode()
        outcome = {"status": response.status_code, "body": body, "headers": _kept(response)}
        await self.ledger.settle(self.key, self.fingerprint, outcome)
        return response

    async def _unsettled(self, entry: Entry, repeatable: bool) -> None:
        end = self.ledger.forget if repeatable else self.ledger.lapse
        await asyncio.shield(end(self.key, entry))


async def _input(request: Request) -> Any:
    """What identifies a request: its method, path and body (JSON parsed: its keys' order
    and spacing do not count)."""
    raw = await request.body()
    try:
        body: Any = json.loads(raw) if raw.strip() else None
    except (ValueError, UnicodeDecodeError):
        body = raw.decode(errors="replace")
    return {"method": request.method, "path": request.url.path, "body": body}


def _kept(response: Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k in ("content-type", "location")}


def _replayed(outcome: Any) -> Response:
    record = outcome if isinstance(outcome, dict) else {}
    headers = {**record.get("headers", {}), REPLAYED: "true", "Cache-Control": "no-store"}
    return Response(str(record.get("body", "")), int(record.get("status", 200)), headers=headers)
