"""``operationId`` on the MCP mutation tools: a retried call returns the first result.

A mutation tool (:attr:`.mcp_tools.SessionTool.mutation`: ``session_create``,
``session_prompt``, ``session_cancel``, ``session_resume``, ``session_stop``,
``session_delete``, ``interaction_respond``) called with an ``operationId`` runs once per
id: the id is an operation id in the operation ledger (:mod:`broker.store.operations`,
through :class:`~broker.front.operation_claims.OperationClaim`, as ACP's and REST's are),
keyed by the caller's tenant and principal subject (client instance ``mcp``), with the
tool's name and arguments (less the id) as its input. A retry with the same id and input
gets the first result (its text, an error result too) and runs nothing again; with another
input, ``operation_conflict``. A failure that is not a refusal (``unavailable``,
``internal``) is not kept: a retry runs. A retry while the first call still runs waits for
it (bounded); when the first died mid-way, a prompt is ``operation_outcome_unknown`` and
the other tools run again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from ...auth.principal import Principal
from ...errors import ApiError, ErrorCode
from ...errors.operations import rest_conflict, rest_outcome_unknown, rest_pending
from ...protocol.operations import OPERATION_ID, fingerprint
from ...store.operations import Claim, OperationKey, OperationLedger
from ..operation_claims import OperationClaim

MCP_CLIENT: Final = "mcp"
"""The client instance of MCP callers' keys (an MCP session names no installation)."""
_FAILURES: Final = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL})
"""Codes that say the broker failed, not that the call was refused: never kept."""

Outcome = tuple[str, bool]
"""A call's result: its text, and whether it is an error result."""


async def once(
    ledger: OperationLedger,
    caller: Principal,
    tool: str,
    arguments: dict[str, Any],
    call: Callable[[], Awaitable[str]],
    *,
    repeatable: bool,
    wait: float,
) -> Outcome:
    """``call``'s result, run once per ``operationId`` in ``arguments`` (run plainly
    without one); a refusal (:class:`ApiError`) is a result too, as the tools answer it."""
    op = arguments.get(OPERATION_ID)
    if not isinstance(op, str):
        return await _plain(call)
    key = OperationKey(caller.tenant, caller.subject, MCP_CLIENT, op)
    claim = OperationClaim(
        ledger,
        key,
        fingerprint(f"tools/call {tool}", arguments),
        repeatable=repeatable,
    )
    entry = await claim.decide(wait)
    if entry.claim is Claim.CONFLICT:
        return _error(rest_conflict(OPERATION_ID))
    if entry.claim is Claim.DONE:
        record = entry.outcome if isinstance(entry.outcome, dict) else {}
        return str(record.get("text", "")), bool(record.get("isError"))
    if entry.claim in (Claim.PENDING, Claim.FORGOTTEN):
        unknown = entry.claim is Claim.FORGOTTEN or entry.lapsed
        return _error(rest_outcome_unknown(OPERATION_ID) if unknown else rest_pending(OPERATION_ID))
    async with claim.running():
        text, failed = outcome = await _plain(call)
        if failed and text.split(":", 1)[0] in _FAILURES:
            await claim.unsettled()
        else:
            await claim.settle({"text": text, "isError": failed})
    return outcome


async def _plain(call: Callable[[], Awaitable[str]]) -> Outcome:
    try:
        return await call(), False
    except ApiError as error:
        return _error(error)


def _error(error: ApiError) -> Outcome:
    return f"{error.code}: {error.message}", True
