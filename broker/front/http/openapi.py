"""The OpenAPI 3.1 document of the REST API, served at ``/v1/openapi.json``.

Its parameters, bodies and answers are generated from the models every surface reads
and writes (:mod:`.tool_models`, :mod:`.tool_outputs`): what it says is what is checked.
"""

from __future__ import annotations

from functools import cache

from ...store.events import JsonObject
from . import openapi_tools as tool_paths
from .openapi_events import SESSION_EVENT
from .sessions import TOOL_DESCRIPTION
from .tool_inputs import query_parameters
from .tool_models import AFTER_REST, SessionListInput
from .tool_outputs import output_schemas

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
            **tool_paths.interaction_paths(),
            **tool_paths.presence_paths(),
            **tool_paths.access_paths(),
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
                **output_schemas(),
                "SessionEvent": SESSION_EVENT,
                **tool_paths.schemas(),
            },
        },
    }


def _list_operation() -> JsonObject:
    parameters = query_parameters(SessionListInput, {"after": AFTER_REST})
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
