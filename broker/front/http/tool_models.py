"""The session tools' inputs, each written once: its kinds of input and a model per tool.

Every MCP tool, REST route and ``acp-broker sessions`` reads its inputs through one of
these models (:meth:`~.tool_inputs.ToolInput.parse`), and ``tools/list`` and the OpenAPI
document describe them from the same models (:func:`~.tool_inputs.input_schema`). A new
input is a field here; a new tool is a model here and a handler in :mod:`.mcp_tools`.

Each kind of input below pairs its check (the words a bad value gets: clients and models
match on them) with the JSON Schema of the values it takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from ...errors import invalid_argument
from ...protocol.interactions import ELICITATION_ACTIONS, INTERACTION_ID
from ...protocol.jsonrpc import RpcError
from ...protocol.operations import ID_RULE, OPERATION_ID
from ...store.events import JsonObject
from ...store.names import SESSION_ID_RULE, is_session_id
from ...store.query import (
    KIND_VALUES,
    LIMIT_DEFAULT,
    LIMIT_MAX,
    LIMIT_MIN,
    Q_MAX_CHARS,
    STATUS_VALUES,
    SessionQuery,
)
from ..acp.params import absolute
from .tool_inputs import LIST_WORDING, InputKind, ToolInput

WAIT_DEFAULT = 60
WAIT_MAX = 600

# -- the kinds of input ---------------------------------------------------------------------


def session_id_of(value: Any) -> str:
    """A session id input, checked (``invalid_argument``)."""
    if not isinstance(value, str) or not value:
        raise invalid_argument("id must be a session id (a non-empty string)")
    if not is_session_id(value):
        raise invalid_argument(f"id is not a session id of this broker ({SESSION_ID_RULE})")
    return value


def wait_of(value: Any) -> float:
    """A ``wait`` input in seconds, 0 to 600 (default 60)."""
    if value is None:
        return WAIT_DEFAULT
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= WAIT_MAX:
        raise invalid_argument(f"wait must be a number of seconds from 0 to {WAIT_MAX}")
    return float(value)


def _prose(name: str, *, optional: bool = False) -> InputKind:
    """Text with something in it besides blanks (a prompt); ``optional``: or nothing."""

    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip():
            raise invalid_argument(f"{name} must be a non-empty string")
        return value

    return InputKind(check, {"type": "string", "minLength": 1, "pattern": "\\S"})


def _cwd(value: Any) -> str:
    try:
        return absolute(value, "cwd")
    except RpcError as exc:
        raise invalid_argument(exc.message) from None


def _agent(value: Any) -> str | None:
    """A configured agent's name; nothing (or an empty name) for the default one."""
    if not value:
        return None
    if not isinstance(value, str):
        raise invalid_argument("agent must be the name of a configured agent")
    return value


def _title(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise invalid_argument("title must be a string")
    return value


def _metadata(value: Any) -> JsonObject:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_argument("userMetadata must be an object")
    return value


def _filter_text(name: str, value: Any) -> str | None:
    """A list filter: text, stripped (left out when blank: a query string's ``status=``)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_argument(f"{name} must be a string")
    return value.strip() or None


def _statuses(value: Any) -> tuple[str, ...]:
    text = _filter_text("status", value)
    if text is None:
        return ()
    wanted = {part.strip().upper() for part in text.split(",") if part.strip()}
    bad = sorted(wanted - set(STATUS_VALUES))
    if bad:
        raise invalid_argument(
            f"unknown status {bad[0]!r}: status is RUNNING, STOPPED, DELETED or ERROR, "
            "or several of them joined with commas"
        )
    return tuple(s for s in STATUS_VALUES if s in wanted)


def _kind(value: Any) -> str | None:
    text = _filter_text("kind", value)
    if text is None:
        return None
    kind = text.lower()
    if kind not in KIND_VALUES:
        raise invalid_argument(f"unknown kind {text!r}: kind is browser, shell or combined")
    return kind


def _q(value: Any) -> str | None:
    text = _filter_text("q", value)
    if text is not None and len(text) > Q_MAX_CHARS:
        raise invalid_argument(f"q must be at most {Q_MAX_CHARS} characters")
    return text


def _limit(value: Any) -> int:
    """A count: an integer, or its ASCII digits (a query string's ``limit=25``)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return LIMIT_DEFAULT
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        number = int(value.strip())  # ASCII only: "²" is a digit to isdigit(), not to int()
    if number is None or not LIMIT_MIN <= number <= LIMIT_MAX:
        raise invalid_argument(
            f"limit must be an integer from {LIMIT_MIN} to {LIMIT_MAX}; got {value!r}"
        )
    return number


_TEXT = {"type": "string"}
_ONE_STATUS = "|".join(STATUS_VALUES)

SessionId = Annotated[str, InputKind(session_id_of, _TEXT | {"pattern": "^sess_[0-9a-f]{32}$"})]
Wait = Annotated[
    float,
    InputKind(wait_of, {"type": "number", "minimum": 0, "maximum": WAIT_MAX}),
    Field(
        description=f"Seconds to wait for the turn to end, 0 to {WAIT_MAX}. A turn that runs "
        "longer goes on: the answer then holds what came so far (a tool's result ends with "
        "`still running`; REST answers 202)."
    ),
]
Cwd = Annotated[str, InputKind(_cwd, _TEXT | {"pattern": "^/"})]
Agent = Annotated[str | None, InputKind(_agent, _TEXT)]
Title = Annotated[str | None, InputKind(_title, _TEXT)]
Metadata = Annotated[JsonObject, InputKind(_metadata, {"type": "object"})]
Statuses = Annotated[
    tuple[str, ...],
    InputKind(
        _statuses,
        _TEXT | {"pattern": f"^({_ONE_STATUS})(,({_ONE_STATUS}))*$"},
    ),
]
Kind = Annotated[str | None, InputKind(_kind, {"type": "string", "enum": list(KIND_VALUES)})]
Query = Annotated[str | None, InputKind(_q, _TEXT | {"maxLength": Q_MAX_CHARS})]
Limit = Annotated[
    int,
    InputKind(_limit, {"type": "integer", "minimum": LIMIT_MIN, "maximum": LIMIT_MAX}),
]
Cursor = Annotated[str | None, InputKind(lambda value: _filter_text("after", value), _TEXT)]

# -- the tools' inputs ----------------------------------------------------------------------

AFTER_TOOL = (
    'The cursor from the last result (its last line says `after "…"`), to read the sessions '
    "that follow. Leave it out for the first page."
)
AFTER_REST = (
    "The `next_cursor` of the last result, to read the sessions that follow. Leave it out for "
    "the first page."
)


class SessionListInput(ToolInput):
    """``session_list``, ``GET /v1/sessions`` and ``acp-broker sessions``."""

    status: Statuses = Field(
        default=(),
        description="Only sessions with this status: `RUNNING`, `STOPPED`, `DELETED` or "
        "`ERROR`. Join several with commas, for example `RUNNING,STOPPED`. Leave it out to "
        "not filter by status.",
        examples=["RUNNING", "RUNNING,STOPPED"],
    )
    kind: Kind = Field(
        default=None,
        description="Only sessions of this kind: `browser` (a browser only), `shell` "
        "(a shell only) or `combined` (a browser and a shell).",
    )
    q: Query = Field(
        default=None,
        description="Search: a session id prefix, or text found in the session's `userMetadata`.",
    )
    limit: Limit = Field(
        default=LIMIT_DEFAULT,
        description=f"How many sessions to list, {LIMIT_MIN} to {LIMIT_MAX}.",
    )
    after: Cursor = Field(default=None, description=AFTER_TOOL)

    def query(self) -> SessionQuery:
        """The store's list query for these inputs."""
        return SessionQuery(self.status, self.kind, self.q, self.limit, self.after)


class SessionRef(ToolInput):
    """A tool that takes a session and nothing else."""

    id: SessionId = Field(description="The session id (from session_list or session_create).")


def operation_id_of(value: Any) -> str | None:
    """An ``operationId`` input (None: none given)."""
    if value is not None and (not isinstance(value, str) or not ID_RULE.fullmatch(value)):
        raise invalid_argument(f"{OPERATION_ID} must be 1 to 128 visible ASCII characters")
    return value


OperationId = Annotated[
    str | None, InputKind(operation_id_of, _TEXT | {"pattern": ID_RULE.pattern})
]


class OperationInput(ToolInput):
    """A mutation tool's ``operationId``: the same id on a retry returns the first outcome
    and never applies twice (the operation ledger, as ACP's ``operationId`` and REST's
    ``Idempotency-Key``)."""

    operationId: OperationId = Field(  # the wire's name
        default=None,
        description=(
            "Your id of this operation (a UUID, say), kept for its retries: a retry with the "
            "same id and inputs returns the first result and never applies twice; the same "
            "id with other inputs is refused (operation_conflict)."
        ),
    )


class SessionChange(OperationInput, SessionRef):
    """A tool that changes a session and takes nothing else (but an ``operationId``)."""


class PromptInput(ToolInput):
    """``POST /v1/sessions/{id}/prompt``'s body (the session is in the path)."""

    text: Annotated[str, _prose("text")] = Field(description="The prompt.")
    wait: Wait = WAIT_DEFAULT


class SessionPrompt(OperationInput, PromptInput, SessionRef):
    """``session_prompt``: a session and the prompt (the session's id first)."""


class CreateSession(ToolInput):
    """``session_create`` and ``POST /v1/sessions``."""

    cwd: Cwd = Field(description="The absolute path the agent works in.")
    agent: Agent = Field(
        default=None, description="A configured agent's name (default: the first)."
    )
    title: Title = Field(default=None, description="The session's title.")
    userMetadata: Metadata = Field(  # the wire's name
        default_factory=dict,
        description="Your own data to keep with the session (session_list's q searches it).",
    )
    prompt: Annotated[str | None, _prose("prompt", optional=True)] = Field(
        default=None, description="A first prompt to run at once (optional)."
    )
    wait: Wait = WAIT_DEFAULT


class CreateSessionTool(OperationInput, CreateSession):
    """``session_create`` (``POST /v1/sessions`` takes its key as a header)."""


def interaction_id_of(value: Any) -> str:
    if not isinstance(value, str) or not INTERACTION_ID.fullmatch(value):
        raise invalid_argument(
            "interactionId must be an interaction's id (interaction_ and hex digits, as listed)"
        )
    return value


def _optional_text(name: str) -> InputKind:
    def check(value: Any) -> str | None:
        if value is not None and (not isinstance(value, str) or not value):
            raise invalid_argument(f"{name} must be a non-empty string")
        return value

    return InputKind(check, _TEXT)


def _action(value: Any) -> str | None:
    if value is not None and value not in ELICITATION_ACTIONS:
        raise invalid_argument("action must be accept, decline or cancel")
    return value


def _content(value: Any) -> JsonObject | None:
    if value is not None and not isinstance(value, dict):
        raise invalid_argument("content must be an object")
    return value


InteractionId = Annotated[
    str, InputKind(interaction_id_of, _TEXT | {"pattern": INTERACTION_ID.pattern})
]


class InteractionAnswer(ToolInput):
    """``POST /v1/sessions/{id}/interactions/{iid}/respond``'s body: ``optionId`` for a
    permission, ``action`` (and ``content`` to accept) for an elicitation."""

    optionId: Annotated[str | None, _optional_text("optionId")] = Field(  # the wire's name
        default=None, description="A permission: the option chosen, one the agent sent."
    )
    action: Annotated[
        str | None,
        InputKind(_action, {"type": "string", "enum": sorted(ELICITATION_ACTIONS)}),
    ] = Field(default=None, description="An elicitation: accept, decline or cancel.")
    content: Annotated[JsonObject | None, InputKind(_content, {"type": "object"})] = Field(
        default=None, description="An elicitation accepted: the answers, by field."
    )
    expectedRevision: Annotated[str | None, _optional_text("expectedRevision")] = Field(
        default=None,
        description="Answer only if the interaction is still at this revision (as listed).",
    )

    def response(self) -> JsonObject:
        """The answer as the host checks it against the question."""
        if self.optionId is not None:
            return {"optionId": self.optionId}
        if self.action is None:
            raise invalid_argument("give optionId (a permission) or action (an elicitation)")
        answer: JsonObject = {"action": self.action}
        if self.content is not None:
            answer["content"] = self.content
        return answer


class InteractionRespond(OperationInput, InteractionAnswer, SessionRef):
    """``interaction_respond``: a session, one of its interactions and the answer."""

    interactionId: InteractionId = Field(description="The interaction (from interaction_list).")


class CancelInput(ToolInput):
    """``POST /v1/sessions/{id}/cancel``'s body (optional: the session is in the path)."""

    activityId: Annotated[str | None, _optional_text("activityId")] = Field(  # the wire's name
        default=None,
        description=(
            "Only this prompt's turn (a turn's activityId): a queued one is withdrawn when "
            "you are its author. Default: the running turn."
        ),
    )


class SessionCancel(OperationInput, CancelInput, SessionRef):
    """``session_cancel``: a session, and optionally the activity to cancel."""


class NoInput(ToolInput):
    """A REST action that takes no body (or an empty object)."""


def list_query(args: Mapping[str, Any]) -> SessionQuery:
    """The store's list query for a list's inputs (``invalid_argument`` if one is bad)."""
    return SessionListInput.parse(args, LIST_WORDING).query()
