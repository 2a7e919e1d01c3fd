"""A tool call's arguments: parsed from the model's JSON, and the error texts the model sees when they are wrong."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from app import errors
from app.spec.definitions import PromptDefinition

MISSING_ATTACHMENTS = (
    "Provided attachment path(s) not found in this thread: {paths}. Use an exact /attachments/... path that exists "
    "in this thread, then try again."
)

_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


def parse_arguments(raw: str) -> dict[str, Any]:
    """A tool call's JSON arguments as an object (anything else is an error the model sees)."""
    value = json.loads(raw or "{}")
    if not isinstance(value, dict):
        raise ValueError("tool arguments must be a JSON object")
    return value


def problems(exc: ValidationError) -> str:
    """What pydantic found wrong with a call's arguments, one `field`: message per problem (`arguments` for the
    whole)."""
    return errors.problems(exc.errors(), whole="arguments", spell=lambda name: f"`{name}`")


def missing_attachments(paths: list[str]) -> str:
    """The contract's error text for attachment paths that are not files of the thread (`semantics.md` §5)."""
    return MISSING_ATTACHMENTS.format(paths=", ".join(paths))


def prompt_problem(prompt: PromptDefinition, arguments: dict[str, Any]) -> str | None:
    """What is wrong with the arguments of a call that starts `prompt` (a subprompt, a subagent's first prompt): its
    pydantic `required_schema`, else the top level of its JSON Schema (required properties, their types, no others
    if it says so)."""
    schema = prompt.required_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            schema.model_validate(arguments)
        except ValidationError as exc:
            return problems(exc)
        return None
    return shape_problem(prompt.schema_for_tool(), arguments)


def shape_problem(shape_: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """What is wrong with arguments by the top level of a JSON Schema: required properties, their types, no others
    if it says so."""
    props: dict[str, Any] = shape_.get("properties", {})
    missing = [p for p in shape_.get("required", []) if p not in arguments]
    if missing:
        return "missing " + ", ".join(f"`{p}`" for p in missing)
    if shape_.get("additionalProperties") is False:
        unknown = [k for k in arguments if k not in props]
        if unknown:
            return "unknown " + ", ".join(f"`{k}`" for k in unknown)
    for key, value in arguments.items():
        expected = _TYPES.get(str((props.get(key) or {}).get("type")))
        if expected is not None and (not isinstance(value, expected) or isinstance(value, bool) != (expected is bool)):
            return f"`{key}` must be of type {props[key]['type']}"
    return None
