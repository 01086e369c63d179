"""ACP mutations with an operation id: run once, answered alike on every retry.

:func:`with_operations` wraps the mutation handlers of a surface (see
:mod:`broker.protocol.operations` for which, and where the id travels). A request with an
operation id claims its ledger record (:mod:`broker.store.operations`, key: tenant,
principal, client instance, id) before it runs, and settles it with its outcome; a retry
with the same id and input, on any connection of any front within the ledger's retention,
gets that outcome without running again; one with another input gets
``operation_conflict``. A retry that comes while the first request still runs waits for
its outcome.

When the first request died without settling (its connection closed mid-way, its front
stopped): a prompt's outcome is read from the session's log (the prompt is logged under a
name made from its operation key, and its turn runs on at its agent host), so a prompt
sent again after a deploy never runs twice; a mutation that comes out the same when run
twice (a cancel, a setting, a close, a delete) runs again; a ``session/new`` or ``fork``
is ``operation_outcome_unknown`` (running it again would make a second session).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...errors.operations import (
    operation_conflict,
    operation_outcome_unknown,
    operation_pending,
)
from ...protocol.jsonrpc import INTERNAL_ERROR, JsonObject, Request, RpcError
from ...protocol.operations import (
    MUTATIONS,
    REPEATABLE,
    fingerprint,
    negotiates_remote,
    operation_id,
    without_operation,
)
from ...protocol.turns import PROMPT_ID_META, PROMPT_OUTCOME, client_prompt_id
from ...store.operations import Claim, OperationKey
from ..deadlines import deadline_for
from ..operation_claims import OperationClaim, ledger
from .connection import ClientConnection
from .dispatch import DEFERRED
from .methods_v1 import AcpMethods, MethodHandler
from .turn_outcome import LOST_REASON, prompt_outcome

_OPENING: Final = frozenset({"session/new", "session/fork"})


def with_operations(handlers: Mapping[str, MethodHandler]) -> dict[str, MethodHandler]:
    """``handlers`` with each mutation's handler run through the operation ledger."""
    return {
        method: (_ledgered(handler) if method in MUTATIONS else handler)
        for method, handler in handlers.items()
    }


def _ledgered(handler: MethodHandler) -> MethodHandler:
    async def run(methods: AcpMethods, conn: ClientConnection, request: Request) -> Any:
        remote = negotiates_remote(conn.client_capabilities)
        op = operation_id(request.params, remote=remote)
        if op is None:
            return await handler(methods, conn, request)
        principal = conn.principal.subject if conn.principal is not None else ""
        key = OperationKey(conn.tenant, principal, conn.client_instance, op)
        return await Operation(methods, conn, request, key).run(handler)

    return run


class Operation:
    """One request with an operation id, from its claim to its settled outcome."""

    def __init__(
        self, methods: AcpMethods, conn: ClientConnection, request: Request, key: OperationKey
    ) -> None:
        self.methods, self.conn, self.key = methods, conn, key
        self.ledger = ledger(methods.index.redis, methods.settings)
        self.fingerprint = fingerprint(request.method, request.params)
        self.claim = OperationClaim(
            self.ledger, key, self.fingerprint, repeatable=request.method in REPEATABLE
        )
        params = without_operation(request.params)
        self.prompt_id: str | None = None
        if request.method == "session/prompt":
            # Named after the operation: a retry finds the turn in the log by this name.
            self.prompt_id = client_prompt_id(params) or f"op-{key.digest}"
            meta = params.get("_meta")
            meta = meta if isinstance(meta, dict) else {}
            params["_meta"] = {**meta, PROMPT_ID_META: self.prompt_id}
        self.request = Request(request.method, params, request.id)
        self.wait = deadline_for(request.method, methods.settings)

    async def run(self, handler: MethodHandler) -> Any:
        prompt = self.prompt_id is not None
        # A prompt's outcome is the log's to tell: a retry does not wait for its claim.
        entry = await self.claim.decide(wait=0 if prompt else self.wait)
        if entry.claim is Claim.CONFLICT:
            raise operation_conflict()
        if entry.claim is Claim.FORGOTTEN:
            raise operation_outcome_unknown()
        if entry.claim is Claim.DONE:
            return await self._replay(entry.outcome)
        if entry.claim is Claim.NEW:
            async with self.claim.running():
                return await self._first(handler)
        if prompt:
            return await self._prompt_from_log()
        raise operation_outcome_unknown() if entry.lapsed else operation_pending()

    async def _first(self, handler: MethodHandler) -> Any:
        """Run the request: its outcome (a result or a refusal) settles the record; a
        failure leaves it unsettled (:meth:`OperationClaim.running`)."""
        request, conn = self.request, self.conn
        answered: list[Any] = []
        if request.id is not None:
            if conn.taps is None:
                conn.taps = {}
            conn.taps[request.id] = answered.append  # the reply a handler sends itself
        try:
            result = await handler(self.methods, conn, request)
        except RpcError as exc:
            if exc.code != INTERNAL_ERROR:  # a refusal is an outcome; a failure is not
                await self.claim.settle({"error": exc.to_json()})
            raise
        finally:
            if conn.taps is not None:
                conn.taps.pop(request.id, None)
        if result is DEFERRED:
            result = answered[0] if answered else None
        await self.claim.settle({"result": result})
        return DEFERRED if answered else result

    async def _replay(self, outcome: Any) -> Any:
        """The first request's outcome, for a retry: its error raised, or its result (a
        ``session/new`` or ``fork`` made active on this connection, as it was on the first)."""
        record = outcome if isinstance(outcome, dict) else {}
        error = record.get("error")
        if isinstance(error, dict):
            raise RpcError(
                int(error.get("code", INTERNAL_ERROR)),
                str(error.get("message", "")),
                error.get("data"),
            )
        result = record.get("result")
        conn, request = self.conn, self.request
        session_id = result.get("sessionId") if isinstance(result, dict) else None
        if request.method in _OPENING and isinstance(session_id, str):
            if session_id not in conn.active:
                await self.methods.opened(conn, session_id, replay_after=0)
            conn.reply(request, result)
            conn.release(session_id)
            return DEFERRED
        return result

    async def _prompt_from_log(self) -> Any:
        """A prompt whose first request has no outcome here: its turn's, read from the log
        (the session must be active on this connection, as for any prompt)."""
        assert self.prompt_id is not None
        session_id = self.methods.active_session(self.conn, self.request.params)
        query: JsonObject = {"sessionId": session_id, "promptId": self.prompt_id}
        try:
            result = await prompt_outcome(
                self.methods, self.conn, Request(PROMPT_OUTCOME, query, self.request.id)
            )
        except RpcError as exc:
            data = exc.data if isinstance(exc.data, dict) else {}
            if data.get("reason") == LOST_REASON:
                raise operation_outcome_unknown() from None
            await self.ledger.settle(self.key, self.fingerprint, {"error": exc.to_json()})
            raise
        await self.ledger.settle(self.key, self.fingerprint, {"result": result})
        return result
