"""The official ACP JSON Schemas as checks on everything a broker sends to a client.

The schemas are copies of ``shared/acp/v{1,2}/schema{,.unstable}.json`` (the newest, from
the TypeScript SDK 2.4.0) kept in ``tests/schemas`` so a fresh clone can run the tests (see
its README). :class:`WireChecker` validates each message against the schema of the
connection's negotiated version: the whole message, and the typed payload its method (or,
for a reply, the method of the request it answers) defines. Methods only the unstable
schema defines (``session/set_title``, ``session/fork``) are checked against it; everything
else against the stable one.

Validating thousands of streamed chunks is slow, so a message whose *shape* (the
message with its free-text strings blanked, see :data:`FREE_TEXT`) was already found
valid is not validated again: those fields are unconstrained strings in both schemas,
so the outcome cannot differ.
"""

from __future__ import annotations

import functools
import json
import reprlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators

from broker.protocol.capabilities import LIST_CHANGED_META, LIST_CHANGED_METHOD

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
FREE_TEXT = frozenset({"text", "messageId", "sessionId", "epoch", "title", "toolCallId"})
"""Keys whose string values the schemas do not constrain (any string validates)."""


@functools.cache
def schema(version: int, unstable: bool = False) -> dict[str, Any]:
    name = f"acp-v{version}.unstable.schema.json" if unstable else f"acp-v{version}.schema.json"
    return dict(json.loads((SCHEMAS / name).read_text()))


@functools.cache
def unstable_methods(version: int) -> frozenset[str]:
    """Methods the unstable schema defines and the stable one does not."""

    def methods(unstable: bool) -> set[str]:
        defs = schema(version, unstable)["$defs"].values()
        return {d["x-method"] for d in defs if "x-method" in d}

    return frozenset(methods(True) - methods(False))


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxdict = _SHORT.maxlist = 4
_SHORT.maxlevel = 2
"""How a failing keyword names the value it fails on: jsonschema's own ``type``, ``anyOf``
and ``oneOf`` write the whole value's ``repr`` into each error, also for each branch of a
union that does not match, which is most of them. A megabyte-long replay batch made every
union's failed branches cost milliseconds each: half of the test client's CPU, in the
process that runs the broker under test."""


def _type(validator: Any, types: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    types = types if isinstance(types, list) else [types]
    if not any(validator.is_type(instance, kind) for kind in types):
        kinds = ", ".join(repr(kind) for kind in types)
        yield ValidationError(f"{_SHORT.repr(instance)} is not of type {kinds}")


def _union(exactly_one: bool) -> Any:
    """``anyOf`` (or ``oneOf``: ``exactly_one``) as jsonschema checks it, its errors naming
    the value in short."""

    def check(validator: Any, branches: Any, instance: Any, schema: Any) -> Iterator[Any]:
        failed: list[ValidationError] = []
        for index, branch in enumerate(branches):
            errors = list(validator.descend(instance, branch, schema_path=index))
            if not errors:
                rest = branches[index + 1 :]
                if exactly_one and any(validator.evolve(schema=b).is_valid(instance) for b in rest):
                    yield ValidationError(f"{_SHORT.repr(instance)} is valid under several")
                return
            failed.extend(errors)
        yield ValidationError(
            f"{_SHORT.repr(instance)} is not valid under any of the given schemas",
            context=failed,
        )

    return check


_Checker = validators.extend(
    Draft202012Validator, {"type": _type, "anyOf": _union(False), "oneOf": _union(True)}
)


@functools.cache
def _validator(version: int, name: str | None, unstable: bool = False) -> Any:
    root = schema(version, unstable)
    if name is None:
        return _Checker(root)
    return _Checker({"$schema": DIALECT, "$ref": f"#/$defs/{name}", **_defs(root)})


def _defs(root: dict[str, Any]) -> dict[str, Any]:
    return {"$defs": root["$defs"]}


@functools.cache
def _by_method(version: int, side: str, suffix: str, unstable: bool = False) -> dict[str, str]:
    """``x-method`` -> definition name, for one side's requests, responses or notifications."""
    defs = schema(version, unstable)["$defs"]
    return {
        d["x-method"]: name
        for name, d in defs.items()
        if d.get("x-side") == side and name.endswith(suffix) and "x-method" in d
    }


@functools.cache
def known_updates(version: int) -> frozenset[str]:
    """The ``sessionUpdate`` values the version defines (not its open "other" fallback)."""
    union = schema(version)["$defs"]["SessionUpdate"]
    variants = union.get("oneOf") or union.get("anyOf")
    return frozenset(
        v["properties"]["sessionUpdate"]["const"]
        for v in variants
        if "const" in v.get("properties", {}).get("sessionUpdate", {})
    )


EXTENSIONS = {LIST_CHANGED_META: LIST_CHANGED_METHOD}
"""The broker's extension notifications, by the client capability (``_meta``) that asks."""


def extensions_asked(meta: Any) -> frozenset[str]:
    """The extension methods a client whose capabilities' ``_meta`` is ``meta`` may be sent."""
    if not isinstance(meta, dict):
        return frozenset()
    return frozenset(method for key, method in EXTENSIONS.items() if meta.get(key) is True)


class WireChecker:
    """Validates what one connection receives; knows the methods of the requests it sent,
    and the extension notifications it asked for (``extensions``: any other is an error)."""

    def __init__(self, version: int, extensions: frozenset[str] = frozenset()) -> None:
        self.version = version
        self.extensions = extensions
        self.sent: dict[Any, str] = {}
        self.checked = 0
        self._valid_shapes: set[str] = set()

    def sending(self, payload: Any) -> None:
        """Remember the method of each request going out, to check its reply."""
        for message in payload if isinstance(payload, list) else [payload]:
            if isinstance(message, dict) and "method" in message and "id" in message:
                self.sent[message["id"]] = message["method"]

    def check(self, message: Any) -> None:
        """Raise AssertionError unless ``message`` is valid for this version."""
        if isinstance(message, list):
            assert message, "an empty batch reply must never be sent"
            for item in message:
                self.check(item)
            return
        self._valid(None, message)
        if "method" in message:
            self._check_outgoing_call(message)
        elif "error" in message:
            self._valid("Error", message["error"])
        else:
            method = self.sent.get(message.get("id")) or ""
            unstable = method in unstable_methods(self.version)
            name = _by_method(self.version, "agent", "Response", unstable).get(method)
            if name is not None:
                self._valid(name, message["result"], unstable)
        self.checked += 1

    def _check_outgoing_call(self, message: dict[str, Any]) -> None:
        method = message["method"]
        if method == "$/cancel_request":
            self._valid("CancelRequestNotification", message["params"])
            return
        if method.startswith("_"):
            self._check_extension(message)
            return
        suffix = "Request" if "id" in message else "Notification"
        name = _by_method(self.version, "client", suffix).get(method)
        assert name is not None, f"v{self.version} clients have no method {method}: {message}"
        self._valid(name, message["params"])
        if method == "session/update":
            kind = message["params"]["update"]["sessionUpdate"]
            assert kind in known_updates(self.version), f"not a v{self.version} update: {kind}"

    def _check_extension(self, message: dict[str, Any]) -> None:
        """An extension method (ACP reserves names that begin with ``_``, the extensibility
        page): a notification the client asked for, its params an object (JSON-RPC's by-name
        params; the broker sends no positional ones)."""
        method = message["method"]
        assert "id" not in message, f"the broker sends no extension requests: {message}"
        assert method in self.extensions, f"sent {method} without being asked: {message}"
        params = message.get("params")
        assert isinstance(params, dict), f"{method} params must be an object: {message}"
        self._valid("ExtNotification", params)

    def _valid(self, name: str | None, value: Any, unstable: bool = False) -> None:
        shape = f"{name}:{unstable}:{json.dumps(_shape(value), sort_keys=True)}"
        if shape in self._valid_shapes:
            return
        errors = sorted(_validator(self.version, name, unstable).iter_errors(value), key=str)
        assert not errors, f"v{self.version} {name or 'message'} invalid: {errors[0]}\n{value}"
        self._valid_shapes.add(shape)


def _shape(value: Any, key: str = "") -> Any:
    """``value`` with free-text strings and sequence numbers blanked."""
    if isinstance(value, dict):
        return {k: _shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    if key in FREE_TEXT and isinstance(value, str):
        return ""
    if key in ("seq", "id") and isinstance(value, int) and not isinstance(value, bool):
        return 0
    return value
