"""The checks of ACP request params shared by the methods (-32602 for what fails them)."""

from __future__ import annotations

import posixpath
from typing import Any

from ...protocol.jsonrpc import JsonObject, invalid_params
from ...store.index import normalize_cwd
from ...store.names import SESSION_ID_RULE, is_session_id


def session_id_of(params: JsonObject) -> str:
    """The request's ``sessionId``, which must have the one shape the broker's ids have
    (so that no id, however spelled, names another tenant's keys)."""
    session_id = params.get("sessionId")
    if not isinstance(session_id, str) or not session_id:
        raise invalid_params("sessionId must be a non-empty string")
    if not is_session_id(session_id):
        raise invalid_params(f"sessionId is not a session id of this broker ({SESSION_ID_RULE})")
    return session_id


MAX_PATH_CHARS = 4096
"""The longest path the broker takes (Linux's ``PATH_MAX``): a ``cwd`` is kept, per tenant,
in the listings' caches, so its length bounds what a client can make them hold."""


def absolute(value: Any, name: str) -> str:
    """An absolute POSIX path in normal form (a trailing ``/`` aside): no NUL, no ``.`` or
    ``..`` component, no ``//``, since it is handed to an agent as where it works."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise invalid_params(f"{name} must be an absolute path")
    if len(value) > MAX_PATH_CHARS:  # none longer names a directory; the caches keep paths
        raise invalid_params(f"{name} must be at most {MAX_PATH_CHARS} characters")
    if "\0" in value:
        raise invalid_params(f"{name} must not hold a NUL character")
    if ".." in value.split("/"):
        raise invalid_params(f"{name} must not hold a '..' component")
    if posixpath.normpath("/" + value.lstrip("/")) != normalize_cwd(value):
        raise invalid_params(f"{name} must be a normalized path (no '.' component, no '//')")
    return value


def directories(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_params("additionalDirectories must be a list of absolute paths")
    return [absolute(item, "each of additionalDirectories") for item in value]


def json_object(value: Any, name: str) -> JsonObject:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_params(f"{name} must be an object")
    return value


def json_list(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_params(f"{name} must be a list")
    return value
