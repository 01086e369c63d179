"""The broker's REST surface: ``GET /v1/sessions``, its OpenAPI document, and health.

:meth:`RestApi.answer` takes a method, a request target and the headers and
returns an :class:`HttpAnswer`, which the HTTP port's app (:mod:`.app`) sends as
it is. Errors are RFC 9457 problem documents (``application/problem+json``) with
a ``code`` member.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

from ...auth.credentials import Credentials
from ...errors import ApiError, ErrorCode
from .openapi import openapi_document
from .sessions import SessionsService
from .tool_outputs import Problem, SessionList, session_object

SESSIONS_PATH = "/v1/sessions"
OPENAPI_PATH = "/v1/openapi.json"
PATHS = (SESSIONS_PATH, OPENAPI_PATH)
JSON = "application/json"
PROBLEM_JSON = "application/problem+json"


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A complete HTTP response."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def json_answer(status: int, document: object, *, media_type: str = JSON) -> HttpAnswer:
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    headers = [("Content-Type", media_type), ("Cache-Control", "no-store")]
    return HttpAnswer(status, headers, body)


def problem(error: ApiError, *, allow: str = "GET") -> HttpAnswer:
    """``error`` as an RFC 9457 problem document (``allow``: the ``Allow`` header of a 405)."""
    status = error.status
    document: Problem = {
        "type": "about:blank",
        "title": status.phrase,
        "status": status.value,
        "detail": error.message,
        "code": str(error.code),
    }
    answer = json_answer(status.value, document, media_type=PROBLEM_JSON)
    if error.code == ErrorCode.UNAUTHORIZED:
        answer.headers.append(("WWW-Authenticate", 'Bearer realm="acp-broker"'))
    if error.code == ErrorCode.METHOD_NOT_ALLOWED:
        answer.headers.append(("Allow", allow))
    return answer


class RestApi:
    """Answers the REST endpoints for any transport."""

    def __init__(self, sessions: SessionsService, *, creates: bool = False) -> None:
        self.sessions = sessions
        self.creates = creates
        """Whether ``POST /v1/sessions`` is served (by the session routes) beside GET."""
        self._routes: dict[str, Callable[[str, Mapping[str, str]], Awaitable[HttpAnswer]]] = {
            SESSIONS_PATH: self._list_sessions,
            OPENAPI_PATH: self._openapi,
        }

    async def answer(self, method: str, target: str, headers: Mapping[str, str]) -> HttpAnswer:
        """Answer one request (``target`` is the path with its query string)."""
        path, _, query = target.partition("?")
        route = self._routes.get(path)
        if route is None:
            return problem(ApiError(ErrorCode.NOT_FOUND, f"no endpoint at {path}"))
        if method != "GET":
            allow = "GET, POST" if self.creates and path == SESSIONS_PATH else "GET"
            refusal = ApiError(ErrorCode.METHOD_NOT_ALLOWED, f"{path} answers {allow} only")
            return problem(refusal, allow=allow)
        try:
            return await route(query, headers)
        except ApiError as error:
            return problem(error)

    async def _list_sessions(self, query: str, headers: Mapping[str, str]) -> HttpAnswer:
        args = _query_args(query)
        credentials = Credentials("http", headers.get("authorization"))
        page = await self.sessions.page(args, credentials)
        document: SessionList = {
            "data": [session_object(row) for row in page.rows],
            "has_more": page.has_more,
            "next_cursor": page.next_cursor,
        }
        answer = json_answer(200, document)
        if page.next_cursor is not None:
            answer.headers.append(("Link", _next_link(args, page.next_cursor)))
        return answer

    async def _openapi(self, query: str, headers: Mapping[str, str]) -> HttpAnswer:
        return json_answer(200, openapi_document())


def _query_args(query: str) -> dict[str, str]:
    """The query string as inputs; a parameter given twice is an ``invalid_argument``."""
    args: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in args:
            raise ApiError(
                ErrorCode.INVALID_ARGUMENT,
                f"{name} is given more than once (join several statuses with commas)",
            )
        args[name] = value
    return args


def _next_link(args: Mapping[str, str], cursor: str) -> str:
    params = {name: value for name, value in args.items() if name != "after" and value.strip()}
    params["after"] = cursor
    return f'<{SESSIONS_PATH}?{urlencode(params)}>; rel="next"'
