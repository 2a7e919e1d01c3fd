"""A tool call's arguments: parsed from the model's JSON, and the error texts the model sees when they are wrong."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from app import errors

MISSING_ATTACHMENTS = (
    "Provided attachment path(s) not found in this thread: {paths}. Use an exact /attachments/... path that exists "
    "in this thread, then try again."
)


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
