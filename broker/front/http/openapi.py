"""The OpenAPI 3.1 document of the REST API, served at ``/v1/openapi.json``."""

from __future__ import annotations

from functools import cache

from ...errors import ErrorCode
from ...store.events import JsonObject
from ...store.query import KIND_VALUES, STATUS_VALUES
from . import openapi_tools as tool_paths
from .openapi_events import SESSION_EVENT
from .sessions import AFTER_REST, TOOL_DESCRIPTION, input_properties

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


@cache
def openapi_document() -> JsonObject:
    """The whole document (built once; callers must not change it)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "acp-broker",
            "version": "1",
            "description": "The REST API of acp-broker, a broker for the Agent Client Protocol.",
        },
        "servers": [{"url": "/"}],
        "paths": {
            "/v1/sessions": {"get": _list_operation(), "post": tool_paths.create_operation()},
            **tool_paths.session_paths(),
        },
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token (`acpb_…`, from `acp-broker token create`) or "
                    "a JWT, with the `read` scope to read and the `write` scope to change. Not "
                    "needed when authentication is off.",
                }
            },
            "schemas": {
                "Session": _session_schema(),
                "SessionList": _list_schema(),
                "Problem": _problem_schema(),
                "SessionEvent": SESSION_EVENT,
                **tool_paths.schemas(),
            },
        },
    }


def _list_operation() -> JsonObject:
    parameters = [
        {
            "name": name,
            "in": "query",
            "required": False,
            "description": schema["description"],
            "schema": {k: v for k, v in schema.items() if k != "description"},
        }
        for name, schema in input_properties(after=AFTER_REST).items()
    ]
    return {
        "operationId": "listSessions",
        "summary": "List sessions",
        "description": TOOL_DESCRIPTION,
        "parameters": parameters,
        "responses": {
            "200": {
                "description": "A page of sessions, newest first.",
                "headers": {
                    "Link": {
                        "description": 'The next page, as `<…>; rel="next"`, when there is one.',
                        "schema": {"type": "string"},
                    }
                },
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/SessionList"}}
                },
            },
            "400": problem_response("`invalid_argument` or `invalid_cursor`."),
            "401": problem_response("`unauthorized`: no credential, or not a good one."),
            "403": problem_response("`forbidden`: the credential lacks the `read` scope."),
            "503": problem_response("`unavailable`: the session store cannot be reached."),
        },
    }


def problem_response(description: str) -> JsonObject:
    content = {"application/problem+json": {"schema": _PROBLEM_REF}}
    return {"description": description, "content": content}


def _session_schema() -> JsonObject:
    text = {"type": "string"}
    return {
        "type": "object",
        "required": ["id", "status", "kind", "createdAt", "updatedAt", "userMetadata"],
        "properties": {
            "id": text | {"description": "The session id (ACP `sessionId`)."},
            "status": {"type": "string", "enum": list(STATUS_VALUES)},
            "kind": {"type": ["string", "null"], "enum": [*KIND_VALUES, None]},
            "createdAt": text | {"format": "date-time"},
            "updatedAt": text | {"format": "date-time"},
            "title": {"type": ["string", "null"]},
            "cwd": text,
            "additionalDirectories": {"type": "array", "items": text},
            "agent": {"type": ["string", "null"]},
            "userMetadata": {"type": "object", "description": "The session's `_meta`."},
        },
    }


def _list_schema() -> JsonObject:
    return {
        "type": "object",
        "required": ["data", "has_more", "next_cursor"],
        "properties": {
            "data": {"type": "array", "items": {"$ref": "#/components/schemas/Session"}},
            "has_more": {"type": "boolean"},
            "next_cursor": {
                "type": ["string", "null"],
                "description": "Pass as `after` to read the next page; null on the last page.",
            },
        },
    }


def _problem_schema() -> JsonObject:
    return {
        "type": "object",
        "description": "An RFC 9457 problem document.",
        "required": ["type", "title", "status", "detail", "code"],
        "properties": {
            "type": {"type": "string", "format": "uri-reference"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "code": {"type": "string", "enum": [str(code) for code in ErrorCode]},
        },
    }
