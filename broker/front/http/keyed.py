"""``Idempotency-Key`` on every REST mutation: a retried request gets the first response.

A mutation (``POST /v1/sessions``, ``DELETE /v1/sessions/{id}``, ``POST …/prompt``,
``…/cancel``, ``…/resume``, ``…/stop``, ``…/interactions/{iid}/respond``) sent with an
``Idempotency-Key`` header (1 to 255 visible ASCII characters) runs once per key: the key is
an operation id in the operation ledger (:mod:`broker.store.operations`, through
:class:`~broker.front.operation_claims.OperationClaim`, as ACP's and MCP's are), per
tenant, with the request's method, path and body as its input. A retry with the same key and
input is answered with the first response (status and body, marked
``Idempotent-Replayed: true``); with another input, ``operation_conflict`` (409). A response
the broker failed with (5xx) is not kept: a retry runs. A retry that comes while the first
still runs waits for it (bounded). When the first request died without a response (its
claim's lease, renewed while it runs, lapsed): a create, cancel, resume, stop, delete or
answer runs again (the same when run twice; a create the dead front may have made is never
named, so the retry makes the session); a prompt is ``operation_outcome_unknown`` (409), and
nothing runs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

from ...auth.principal import Scope
from ...config import Settings
from ...errors import ApiError, invalid_argument
from ...errors.operations import rest_conflict, rest_outcome_unknown, rest_pending
from ...protocol.operations import digest
from ...store.client import Store
from ...store.operations import Claim, OperationKey
from ..operation_claims import OperationClaim, ledger
from .rest import problem

Endpoint = Callable[[Request], Awaitable[Response]]
Caller = Callable[[Request, Scope], Awaitable[str]]
HEADER: Final = "idempotency-key"
KEY_MAX: Final = 255
REPLAYED: Final = "Idempotent-Replayed"
"""Header of a response that is the first request's, replayed."""
REST_CLIENT: Final = "rest"
"""The client instance of REST callers' keys (keys are the tenant's, as for creates)."""


def checked_key(value: str) -> str:
    """An ``Idempotency-Key`` header: 1 to 255 visible ASCII characters."""
    if not 1 <= len(value) <= KEY_MAX or not all(33 <= ord(c) <= 126 for c in value):
        raise invalid_argument(
            f"Idempotency-Key must be 1 to {KEY_MAX} visible ASCII characters (a UUID, say)"
        )
    return value


class KeyedMutations:
    """Wraps mutation endpoints with the ledger (see the module)."""

    def __init__(self, redis: Store, settings: Settings, caller: Caller) -> None:
        self.ledger = ledger(redis, settings)
        self.settings = settings
        self.caller = caller

    def keyed(self, endpoint: Endpoint, *, repeatable: bool) -> Endpoint:
        """``endpoint`` (answering with problem documents) run once per ``Idempotency-Key``.
        ``repeatable``: running it twice comes out the same."""

        async def run(request: Request) -> Response:
            return await self.once(request, lambda: endpoint(request), repeatable=repeatable)

        return run

    async def once(
        self, request: Request, endpoint: Callable[[], Awaitable[Response]], *, repeatable: bool
    ) -> Response:
        """``endpoint``'s response to ``request``, run once per ``Idempotency-Key`` (run
        plainly without one); the first response replayed to a retry, its errors as
        problem documents."""
        header = request.headers.get(HEADER)
        if header is None:
            return await endpoint()
        try:
            tenant = await self.caller(request, Scope.WRITE)
            key = OperationKey(tenant, "", REST_CLIENT, checked_key(header))
            claim = OperationClaim(
                self.ledger, key, digest(await _input(request)), repeatable=repeatable
            )
            return await _run(claim, endpoint, self.settings.request_timeout)
        except ApiError as error:
            answer = problem(error)
            return Response(answer.body, answer.status, headers=dict(answer.headers))


async def _run(
    claim: OperationClaim, endpoint: Callable[[], Awaitable[Response]], wait: float
) -> Response:
    entry = await claim.decide(wait)
    if entry.claim is Claim.CONFLICT:
        raise rest_conflict()
    if entry.claim is Claim.DONE:
        return _replayed(entry.outcome)
    if entry.claim is Claim.FORGOTTEN:
        raise rest_outcome_unknown()
    if entry.claim is Claim.PENDING:
        raise rest_outcome_unknown() if entry.lapsed else rest_pending()
    async with claim.running():
        response = await endpoint()
        if response.status_code >= 500:  # a failure, not an outcome: a retry runs
            await claim.unsettled()
            return response
        body = bytes(response.body).decode()
        await claim.settle(
            {"status": response.status_code, "body": body, "headers": _kept(response)}
        )
    return response


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
