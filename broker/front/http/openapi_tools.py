"""The OpenAPI description of the session tools' REST routes (part of ``/v1/openapi.json``).

Every route of :mod:`.session_routes`: its inputs (the tools' input models, from
:mod:`.tool_models`), its answers (the documents of :mod:`.tool_outputs`) and each problem
it can answer with, so that a schema-driven test (schemathesis) can check every route
against what it says. Every mutation documents the ``Idempotency-Key`` header, its 409s
(``operation_conflict``, ``operation_outcome_unknown``) and the ``Idempotent-Replayed``
header of a replayed answer (:func:`keyed`).
"""

from __future__ import annotations

from ...store.events import JsonObject
from .openapi_events import event_stream_content
from .tool_inputs import input_schema
from .tool_models import (
    CancelInput,
    CreateSession,
    InteractionAnswer,
    InteractionRespond,
    NoInput,
    PromptInput,
    SessionRef,
)

_REF = "#/components/schemas/"
NEVER_REPLAYED = frozenset({"401", "403"})
"""Answers given before the key is looked at (the caller is checked first)."""
KEY_CONFLICTS = (
    "`operation_conflict` (the `Idempotency-Key` was used with another request) or "
    "`operation_outcome_unknown` (the first request with it died without an answer, and "
    "running it again could apply it twice)"
)


def _ref(name: str) -> JsonObject:
    return {"$ref": _REF + name}


def _problem(description: str) -> JsonObject:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }


def _json(description: str, schema: str, **extra: JsonObject) -> JsonObject:
    return {
        "description": description,
        "content": {"application/json": {"schema": _ref(schema)}},
        **extra,
    }


def _problems(scope: str, *more: str) -> JsonObject:
    """The problems every route can answer with, and ``more`` (status codes) of its own."""
    answers = {
        "400": _problem("`invalid_argument`: an input is missing, malformed or out of range."),
        "401": _problem("`unauthorized`: no credential, or not a good one."),
        "403": _problem(f"`forbidden`: the credential lacks the `{scope}` scope."),
        "503": _problem("`unavailable`: the store or the agent hosts cannot be reached."),
    }
    described = {
        "404": "`session_not_found`: no such session (or another tenant's).",
        "409": "`session_busy` (a turn is running), `session_not_running` (the session is "
        "STOPPED or ERROR: resume it first) or, answering an interaction, `revision_conflict`.",
    }
    for status in more:
        answers[status] = _problem(described[status])
    return dict(sorted(answers.items()))


def keyed(operation: JsonObject) -> JsonObject:
    """A mutation's operation, with the ``Idempotency-Key`` header it takes, the 409s the
    key can answer and the ``Idempotent-Replayed`` header of its replayed answers."""
    parameter = {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "description": "Any unique text (a UUID), kept for the request's retries: a retry with "
        "the same key, path and body gets the first answer and runs nothing again (within "
        "the retention window: 24 hours unless configured otherwise).",
        "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
    }
    replayed = {
        "Idempotent-Replayed": {
            "description": "`true`: the answer of the first request with this Idempotency-Key.",
            "schema": {"type": "string", "enum": ["true"]},
        }
    }
    responses: JsonObject = dict(operation["responses"])
    conflict = responses.get("409")
    if conflict is None:
        responses["409"] = _problem(KEY_CONFLICTS + ".")
    else:
        described = conflict["description"].rstrip(".")
        responses["409"] = {**conflict, "description": f"{described}; {KEY_CONFLICTS}."}
    for status, answer in responses.items():
        if status[0] in "24" and status not in NEVER_REPLAYED:  # an answer a retry may get
            responses[status] = {**answer, "headers": {**answer.get("headers", {}), **replayed}}
    parameters = [*operation.get("parameters", []), parameter]
    return {**operation, "parameters": parameters, "responses": dict(sorted(responses.items()))}


def _id_parameter() -> JsonObject:
    schema = input_schema(SessionRef)["properties"]["id"]
    return {"name": "id", "in": "path", "required": True, "schema": schema}


def _body(schema: str, *, required: bool) -> JsonObject:
    return {"required": required, "content": {"application/json": {"schema": _ref(schema)}}}


def create_operation() -> JsonObject:
    """``POST /v1/sessions``."""
    return keyed(
        {
            "operationId": "createSession",
            "summary": "Create a session",
            "description": "A session as an editor's `session/new` makes it, on `agent` "
            "(default: the first configured), optionally running a first `prompt`. With an "
            "`Idempotency-Key`, a retried request returns the first session.",
            "requestBody": _body("CreateSession", required=True),
            "responses": {
                "201": _json(
                    "The session, with its live view URL (and the first prompt's turn).",
                    "SessionWithLink",
                    headers={
                        "Location": {
                            "description": "The session's URL.",
                            "schema": {"type": "string"},
                        }
                    },
                ),
                **_problems("write"),
            },
        }
    )


def session_paths() -> JsonObject:
    """The ``/v1/sessions/{id}…`` paths."""
    one = "/v1/sessions/{id}"
    return {
        one: {
            "parameters": [_id_parameter()],
            "get": {
                "operationId": "getSession",
                "summary": "Get a session",
                "responses": {
                    "200": _json("The session, with its live view URL.", "SessionWithLink"),
                    **_problems("read", "404"),
                },
            },
            "delete": keyed(
                {
                    "operationId": "deleteSession",
                    "summary": "Delete a session",
                    "description": "As `session/delete`: the session then lists as DELETED. "
                    "Deleting it again answers 204 again.",
                    "responses": {"204": {"description": "Deleted."}, **_problems("write", "404")},
                }
            ),
        },
        one + "/prompt": {
            "parameters": [_id_parameter()],
            "post": keyed(
                {
                    "operationId": "promptSession",
                    "summary": "Run a turn",
                    "requestBody": _body("PromptInput", required=True),
                    "responses": {
                        "200": _json("The turn ended within `wait`.", "Turn"),
                        "202": _json(
                            "The turn runs on (or waits for a person): what came so far.", "Turn"
                        ),
                        **_problems("write", "404", "409"),
                    },
                }
            ),
        },
        one + "/cancel": _action(
            "cancelTurn",
            "Cancel the running turn (or, with `activityId`, that turn: withdraw it when queued)",
            _json(
                "The cancelled turn's stop reason (null: none was running, or the activity "
                "was not running nor queued by the caller).",
                "Cancelled",
            ),
            body="CancelInput",
        ),
        one + "/resume": _action(
            "resumeSession",
            "Bring a STOPPED or ERROR session back (RUNNING)",
            _json("The session.", "SessionWithLink"),
        ),
        one + "/stop": _action(
            "stopSession",
            "Release the session's agent process (STOPPED)",
            _json("The session.", "SessionWithLink"),
        ),
        one + "/events": {
            "parameters": [_id_parameter()],
            "get": {
                "operationId": "sessionEvents",
                "summary": "Follow a session's events (Server-Sent Events)",
                "description": "Every event after `after` (or the `Last-Event-ID` header) as "
                "`id: <seq>`, `event: <type>`, `data: <JSON>`, then live ones until the client "
                "leaves; a comment line as a heartbeat.",
                "parameters": [
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 0},
                        "description": "Resume after this event seq.",
                    },
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                        "description": "Resume after this event seq (sent by EventSource).",
                    },
                ],
                "responses": {
                    "200": {
                        "description": "The event stream.",
                        "content": event_stream_content(),
                    },
                    **_problems("read", "404"),
                },
            },
        },
    }


def interaction_paths() -> JsonObject:
    """``/v1/sessions/{id}/interactions`` and ``…/{iid}/respond``."""
    one = "/v1/sessions/{id}/interactions"
    iid = {
        "name": "iid",
        "in": "path",
        "required": True,
        "schema": input_schema(InteractionRespond)["properties"]["interactionId"],
    }
    return {
        one: {
            "parameters": [_id_parameter()],
            "get": {
                "operationId": "listInteractions",
                "summary": "List what the agent waits for a person to answer",
                "responses": {
                    "200": _json("The open and claimed interactions.", "InteractionList"),
                    **_problems("read", "404"),
                },
            },
        },
        one + "/{iid}/respond": {
            "parameters": [_id_parameter(), iid],
            "post": keyed(
                {
                    "operationId": "respondInteraction",
                    "summary": "Answer an interaction",
                    "description": "`optionId` for a permission, `action` (and `content`) for "
                    "an elicitation; `expectedRevision`: only at that revision. 409 "
                    "`revision_conflict`: answered, withdrawn, expired or claimed by another.",
                    "requestBody": _body("InteractionAnswer", required=True),
                    "responses": {
                        "200": _json("The interaction, resolved.", "Interaction"),
                        **_problems("write", "404", "409"),
                    },
                }
            ),
        },
    }


def access_paths() -> JsonObject:
    """``/v1/sessions/{id}/access`` and ``…/{entry}``: the session's ACL (its owners')."""
    one = "/v1/sessions/{id}/access"
    entry = {"name": "entry", "in": "path", "required": True, "schema": {"type": "string"}}
    admin = "403 `forbidden` also when the caller's roles lack `session.admin` (an owner's)."
    return {
        one: {
            "parameters": [_id_parameter()],
            "get": {
                "operationId": "listSessionAccess",
                "summary": "List the session's ACL",
                "description": admin,
                "responses": {
                    "200": _json("The ACL and its revision.", "SessionAccess"),
                    **_problems("read", "404"),
                },
            },
            "post": keyed(
                {
                    "operationId": "grantSessionAccess",
                    "summary": "Grant a principal roles on the session",
                    "description": "Makes or replaces the subject's entry. `principalId` is the "
                    "principal's subject as the broker knows it (`token:<id>`, `jwt:<sub>`). "
                    + admin
                    + " 409 `last_owner`: the grant would leave the session without an owner.",
                    "requestBody": _body("AccessGrant", required=True),
                    "responses": {
                        "200": _json("The entry and the new ACL revision.", "AccessGranted"),
                        **_problems("write", "404", "409"),
                    },
                }
            ),
        },
        one + "/{entry}": {
            "parameters": [_id_parameter(), entry],
            "delete": keyed(
                {
                    "operationId": "revokeSessionAccess",
                    "summary": "Revoke an ACL entry",
                    "description": admin + " 409 `last_owner`: it is the last owner's entry.",
                    "responses": {
                        "200": _json("The entry's id and the new ACL revision.", "AccessRevoked"),
                        **_problems("write", "404", "409"),
                    },
                }
            ),
        },
    }


def presence_paths() -> JsonObject:
    """``/v1/sessions/{id}/presence``."""
    return {
        "/v1/sessions/{id}/presence": {
            "parameters": [_id_parameter()],
            "get": {
                "operationId": "sessionPresence",
                "summary": "Who is attached to the session now",
                "description": "Every window attached to the session, on every front node: "
                "pseudonymous participant and attachment ids, the name a client shared, "
                "roles, `online` or `away` (idle), last activity. Advisory: never used for "
                "authorization; a front node that died leaves within `presence_ttl`.",
                "responses": {
                    "200": _json("The session's presence.", "SessionPresence"),
                    **_problems("read", "404"),
                },
            },
        },
    }


ACCESS_ENTRY_SCHEMA: JsonObject = {
    "type": "object",
    "required": ["entryId", "subject", "roles"],
    "properties": {
        "entryId": {"type": "string"},
        "subject": {
            "type": "object",
            "required": ["type", "principalId"],
            "properties": {
                "type": {"type": "string", "enum": ["principal"]},
                "principalId": {"type": "string", "minLength": 1},
            },
        },
        "roles": {
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {"type": "string", "enum": ["observer", "controller", "approver", "owner"]},
        },
        "expiresAt": {"type": "string", "format": "date-time"},
    },
}


def access_schemas() -> dict[str, JsonObject]:
    grant = ACCESS_ENTRY_SCHEMA["properties"]
    return {
        "AccessEntry": ACCESS_ENTRY_SCHEMA,
        "AccessGrant": {
            "type": "object",
            "required": ["subject", "roles"],
            "properties": {k: grant[k] for k in ("subject", "roles", "expiresAt")},
        },
        "SessionAccess": {
            "type": "object",
            "required": ["sessionId", "aclRevision", "entries"],
            "properties": {
                "sessionId": {"type": "string"},
                "aclRevision": {"type": "string"},
                "entries": {"type": "array", "items": _ref("AccessEntry")},
            },
        },
        "AccessGranted": {
            "type": "object",
            "required": ["entry", "aclRevision"],
            "properties": {"entry": _ref("AccessEntry"), "aclRevision": {"type": "string"}},
        },
        "AccessRevoked": {
            "type": "object",
            "required": ["entryId", "aclRevision"],
            "properties": {"entryId": {"type": "string"}, "aclRevision": {"type": "string"}},
        },
    }


def _action(operation_id: str, summary: str, ok: JsonObject, body: str = "NoInput") -> JsonObject:
    return {
        "parameters": [_id_parameter()],
        "post": keyed(
            {
                "operationId": operation_id,
                "summary": summary,
                "requestBody": _body(body, required=False),
                "responses": {"200": ok, **_problems("write", "404")},
            }
        ),
    }


def schemas() -> dict[str, JsonObject]:
    """The schemas the routes name: the tools' input models, as request bodies."""
    return {
        "CreateSession": input_schema(CreateSession),
        "PromptInput": input_schema(PromptInput),
        "NoInput": input_schema(NoInput),
        "CancelInput": input_schema(CancelInput),
        "InteractionAnswer": input_schema(InteractionAnswer),
        "Interaction": INTERACTION_SCHEMA,
        **access_schemas(),
        "InteractionList": {
            "type": "object",
            "required": ["sessionId", "interactions"],
            "properties": {
                "sessionId": {"type": "string"},
                "interactions": {"type": "array", "items": _ref("Interaction")},
            },
        },
    }


INTERACTION_SCHEMA: JsonObject = {
    "type": "object",
    "required": ["id", "kind", "state", "revision", "request"],
    "properties": {
        "id": {"type": "string"},
        "kind": {"type": "string", "enum": ["permission", "elicitation"]},
        "state": {
            "type": "string",
            "enum": ["open", "claimed", "resolved", "cancelled", "expired"],
        },
        "revision": {"type": "string"},
        "createdAt": {"type": "string"},
        "request": {"type": "object"},
        "options": {"type": "array", "items": {"type": "object"}},
        "claimedBy": {"type": "string"},
        "expiresAt": {"type": "string"},
        "resolvedBy": {"type": "string"},
        "result": {"type": "object"},
    },
}
