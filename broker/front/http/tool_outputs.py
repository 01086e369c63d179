"""The documents the REST routes answer with, each written once as a typed dict.

The code that builds a document builds one of these (mypy checks every member), and the
OpenAPI document's schemas are generated from them (:func:`output_schemas`).
"""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired

from pydantic import Field, TypeAdapter, WithJsonSchema
from typing_extensions import TypedDict

from ...errors import ErrorCode
from ...store.events import JsonObject
from ...store.query import KIND_VALUES, STATUS_VALUES
from .tool_inputs import output_schema

REF = "#/components/schemas/{model}"
_NULLABLE_TEXT = WithJsonSchema({"type": ["string", "null"]})
_DATE_TIME: JsonObject = {"format": "date-time"}


class Session(TypedDict):
    """A session, as `GET /v1/sessions` lists it."""

    id: Annotated[str, Field(description="The session id (ACP `sessionId`).")]
    status: Annotated[str, WithJsonSchema({"type": "string", "enum": list(STATUS_VALUES)})]
    kind: Annotated[
        str | None, WithJsonSchema({"type": ["string", "null"], "enum": [*KIND_VALUES, None]})
    ]
    createdAt: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    updatedAt: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    title: NotRequired[Annotated[str | None, _NULLABLE_TEXT]]
    cwd: NotRequired[str]
    additionalDirectories: NotRequired[list[str]]
    agent: NotRequired[Annotated[str | None, _NULLABLE_TEXT]]
    userMetadata: Annotated[JsonObject, Field(description="The session's `_meta`.")]


class SessionList(TypedDict):
    """A page of sessions, newest first."""

    data: list[Session]
    has_more: bool
    next_cursor: Annotated[
        str | None,
        _NULLABLE_TEXT,
        Field(description="Pass as `after` to read the next page; null on the last page."),
    ]


class TurnReply(TypedDict):
    """What a turn produced so far."""

    activityId: Annotated[
        str, Field(description="The turn's prompt: what a cancel's activityId names.")
    ]
    text: Annotated[str, Field(description="The agent's reply (its message chunks joined).")]
    toolCalls: list[str]
    state: Literal["ended", "queued", "running", "waiting"]
    stopReason: Annotated[str | None, _NULLABLE_TEXT]
    error: NotRequired[Annotated[str | None, _NULLABLE_TEXT]]


class Turn(TurnReply):
    """A prompt's turn, as far as it went within the wait."""

    sessionId: str
    liveViewUrl: str


class SessionWithLink(Session):
    """A session, with its live view URL (and, from a create with a prompt, the turn)."""

    liveViewUrl: Annotated[str, Field(description="The web console, opened on this session.")]
    turn: NotRequired[Turn]


class Cancelled(TypedDict):
    """A cancel's outcome: the cancelled turn's stop reason (null: none was running)."""

    sessionId: str
    stopReason: Annotated[str | None, _NULLABLE_TEXT]


class Problem(TypedDict):
    """An RFC 9457 problem document."""

    type: Annotated[str, Field(json_schema_extra={"format": "uri-reference"})]
    title: str
    status: int
    detail: str
    code: Annotated[str, WithJsonSchema({"type": "string", "enum": [str(c) for c in ErrorCode]})]


class Participant(TypedDict):
    """One attachment (a window) on the session, as its peers may see it: pseudonyms and
    what the client chose to share, never a token, a subject, an address or a connection."""

    attachmentId: Annotated[str, Field(description="The window's attachment (a pseudonym).")]
    participantId: Annotated[
        str, Field(description="Who it is, within this session only (a pseudonym).")
    ]
    displayName: NotRequired[
        Annotated[str, Field(description="The name its client shared at `initialize`.")]
    ]
    roles: list[Literal["observer", "controller", "approver", "owner"]]
    state: Annotated[
        Literal["online", "away"],
        Field(description="`away` after `presence_idle_after` seconds without a request."),
    ]
    lastActiveAt: Annotated[
        str,
        Field(
            description="Its last request (whole seconds).",
            json_schema_extra={"format": "date-time"},
        ),
    ]


class SessionPresence(TypedDict):
    """Who is attached to a session now, on every front node (advisory: never used for
    authorization; a front that died leaves within `presence_ttl`)."""

    sessionId: str
    presenceRevision: Annotated[
        str, Field(description="Counts the changes (a decimal string); each delta carries one.")
    ]
    participants: list[Participant]


DOCUMENTS = (
    Session,
    SessionList,
    SessionWithLink,
    Turn,
    Cancelled,
    Problem,
    Participant,
    SessionPresence,
)


def session_object(row: JsonObject) -> Session:
    """A session as ``GET /v1/sessions`` shows it, from its index row."""
    return {
        "id": row["sessionId"],
        "status": row["status"],
        "kind": row.get("kind") or None,
        "createdAt": row["createdAt"],
        "updatedAt": row["updatedAt"],
        "title": row.get("title"),
        "cwd": row["cwd"],
        "additionalDirectories": row.get("additionalDirectories") or [],
        "agent": row.get("agent") or None,
        "userMetadata": row.get("_meta") or {},
    }


def output_schemas() -> dict[str, JsonObject]:
    """The documents' schemas, by name, as the OpenAPI document's components."""
    schemas: dict[str, JsonObject] = {}
    for document in DOCUMENTS:
        generated = TypeAdapter(document).json_schema(ref_template=REF)
        for name, schema in generated.pop("$defs", {}).items():
            schemas[name] = output_schema(schema)
        schemas[document.__name__] = output_schema(generated)
    return schemas
