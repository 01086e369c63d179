"""How the OpenAPI document describes ``GET /v1/sessions/{id}/events``' Server-Sent Events.

OpenAPI 3.1 has no word for a stream's items, so the ``text/event-stream`` schema describes
one event, as validators of event streams read it (schemathesis: each event an object of its
fields, ``id``, ``event``, ``data``, ``retry``, each a string but ``retry``); ``data`` is JSON
(``contentMediaType``), a :data:`SESSION_EVENT` (``contentSchema``), as
:func:`~.event_stream.frame` writes it.
"""

from __future__ import annotations

from ...store.events import JsonObject

SESSION_EVENT_REF = "#/components/schemas/SessionEvent"

SESSION_EVENT: JsonObject = {
    "type": "object",
    "description": "One event of a session's log: the `data` of its Server-Sent Event.",
    "required": ["seq", "epoch", "ts", "event"],
    "properties": {
        "seq": {
            "type": "integer",
            "minimum": 1,
            "description": "Its position in the session's log (1, 2, 3 …); the event's `id`.",
        },
        "epoch": {
            "type": "string",
            "description": "The log's epoch: a seq read from another epoch is not of this log.",
        },
        "ts": {"type": "integer", "description": "When it was logged (Unix milliseconds)."},
        "event": {
            "type": "object",
            "description": "The event as logged (its fields depend on its type).",
            "required": ["type"],
            "properties": {
                "type": {
                    "type": "string",
                    "description": "What happened (`prompt`, `update`, `prompt_end` …); the "
                    "event's `event`.",
                }
            },
        },
    },
}


def event_stream_content() -> JsonObject:
    """The ``content`` of the events route's 200 response: one Server-Sent Event's schema."""
    event = {
        "type": "object",
        "description": "One Server-Sent Event (a comment line, `: heartbeat`, is none).",
        "required": ["id", "event", "data"],
        "properties": {
            "id": {
                "type": "string",
                "pattern": "^[0-9]{1,18}$",
                "description": "The event's seq: send it back as `Last-Event-ID` to resume.",
            },
            "event": {"type": "string", "description": "The event's type."},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"$ref": SESSION_EVENT_REF},
                "description": "The event as JSON.",
            },
            "retry": {"type": "integer", "description": "Milliseconds to wait to reconnect."},
        },
    }
    return {"text/event-stream": {"schema": event}}
