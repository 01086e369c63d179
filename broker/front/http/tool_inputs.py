"""How a session tool's inputs are declared once and read everywhere.

A tool's inputs are a :class:`ToolInput`: a frozen pydantic model whose fields are typed
with the input kinds of :mod:`.tool_models` (an :class:`InputKind` joins a check, which
words what a bad value gets, to the JSON Schema that describes a good one). From that one model
come the validation (:meth:`ToolInput.parse`), the MCP tool's ``inputSchema`` and the
OpenAPI request body (:func:`input_schema`) and the OpenAPI query parameters
(:func:`query_parameters`).

What differs between the surfaces is only how they word an input they do not take and a
required one left out (:class:`Wording`): MCP tools say ``x is required``, REST bodies let
the input's own check speak (``cwd must be an absolute path``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from ...errors import ApiError, ErrorCode, invalid_argument
from ...store.events import JsonObject

NOTHING: tuple[object, ...] = (None, (), {}, [])
"""Defaults that mean "left out": a schema does not write them."""


@dataclass(frozen=True, slots=True)
class Wording:
    """How a surface words an input it does not take, and a required input left out."""

    unknown: Callable[[str, Sequence[str]], str]
    """(the first unknown name, the names taken, in declared order) -> the message."""
    says_required: bool
    """True: ``<name> is required``; False: the input's own check is given nothing."""


TOOL_WORDING = Wording(
    lambda name, names: f"unknown input {name!r}; inputs: {', '.join(names)}", says_required=True
)
"""The MCP session tools."""
LIST_WORDING = Wording(
    lambda name, names: f"unknown input {name!r}: the inputs are {', '.join(names)}",
    says_required=True,
)
"""The session list, whichever surface asks (MCP, REST's query string, the CLI)."""
BODY_WORDING = Wording(
    lambda name, names: f"unknown member {name!r} (members: {', '.join(sorted(names)) or 'none'})",
    says_required=False,
)
"""A REST request's JSON body."""


class ToolInput(BaseModel):
    """The inputs of one tool: a field per input, in the order they are checked and shown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The inputs' names, in declared order."""
        return _names(cls)

    @classmethod
    def required(cls) -> tuple[str, ...]:
        return _required(cls)

    @classmethod
    def parse(cls, args: Mapping[str, Any], wording: Wording = TOOL_WORDING) -> Self:
        """The inputs, checked: an unknown input first, then a required one left out, then
        the first input (in declared order) its kind refuses, as ``invalid_argument``."""
        names = cls.names()
        unknown = sorted(set(args) - set(names))
        if unknown:
            raise invalid_argument(wording.unknown(unknown[0], names))
        given = dict(args)
        for name in cls.required():
            if given.get(name) is None:
                if wording.says_required:
                    raise invalid_argument(f"{name} is required")
                given[name] = None  # the input's check says what it wants
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            raise invalid_argument(str(exc.errors()[0]["msg"])) from None


@cache
def _names(model: type[ToolInput]) -> tuple[str, ...]:
    return tuple(model.model_fields)  # once: pydantic's model_fields is slow to read


@cache
def _required(model: type[ToolInput]) -> tuple[str, ...]:
    return tuple(name for name, spec in model.model_fields.items() if spec.is_required())


@dataclass(frozen=True, slots=True)
class InputKind:
    """A kind of input, for ``Annotated[T, InputKind(check, schema)]``: ``check`` turns the
    value given (None when it is given as null) into the field's value, or raises an
    ``invalid_argument`` :class:`~broker.errors.ApiError` whose message the caller gets;
    ``schema`` is the JSON Schema of the values it takes, as clients are told."""

    check: Callable[[Any], Any]
    schema: JsonObject

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self._validate)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return dict(self.schema)

    def _validate(self, value: Any) -> Any:
        try:
            return self.check(value)
        except ApiError as error:
            if error.code != ErrorCode.INVALID_ARGUMENT:
                raise
            # The message as it is: a template of its own would read braces in it.
            raise PydanticCustomError(
                str(error.code), "{message}", {"message": error.message}
            ) from None


def input_schema(
    model: type[ToolInput], descriptions: Mapping[str, str] | None = None
) -> JsonObject:
    """The JSON Schema of ``model``'s inputs, as an MCP ``inputSchema`` and an OpenAPI body
    (``descriptions``: a surface's own words for some inputs)."""
    generated = model.model_json_schema()
    properties = {
        name: _described(_plain(schema), (descriptions or {}).get(name))
        for name, schema in generated["properties"].items()
    }
    schema: JsonObject = {"type": "object", "properties": properties}
    if generated.get("required"):
        schema["required"] = list(generated["required"])
    schema["additionalProperties"] = False
    return schema


def query_parameters(
    model: type[ToolInput], descriptions: Mapping[str, str] | None = None
) -> list[JsonObject]:
    """``model``'s inputs as OpenAPI query parameters."""
    properties = input_schema(model, descriptions)["properties"]
    return [
        {
            "name": name,
            "in": "query",
            "required": False,
            "description": schema["description"],
            "schema": {k: v for k, v in schema.items() if k != "description"},
        }
        for name, schema in properties.items()
    ]


def output_schema(schema: JsonObject) -> JsonObject:
    """A generated schema as clients read it: no titles pydantic made up from names."""
    cleaned = _plain(schema)
    if isinstance(cleaned.get("properties"), dict):
        cleaned["properties"] = {k: _plain(v) for k, v in cleaned["properties"].items()}
    return cleaned


def _plain(schema: JsonObject) -> JsonObject:
    """``schema`` without a generated title, and without a default that means nothing."""
    return {
        key: value
        for key, value in schema.items()
        if key != "title" and not (key == "default" and value in NOTHING)
    }


def _described(schema: JsonObject, description: str | None) -> JsonObject:
    return schema if description is None else {**schema, "description": description}
