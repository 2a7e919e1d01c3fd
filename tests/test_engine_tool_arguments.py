"""A tool call's arguments (`app/engine/tool_arguments.py`): parsing, and the error texts the model sees."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from app.engine import tool_arguments
from app.spec import define_prompt


class AddArgs(BaseModel):
    a: int
    b: int


# -- parse_arguments --------------------------------------------------------------------------------------


def test_arguments_parse_to_an_object_and_empty_means_none() -> None:
    assert tool_arguments.parse_arguments('{"a": 1}') == {"a": 1}
    assert tool_arguments.parse_arguments("") == {}


@pytest.mark.parametrize("raw", ["[1]", '"text"', "null", "{not json"])
def test_arguments_that_are_not_an_object_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        tool_arguments.parse_arguments(raw)


# -- error texts ------------------------------------------------------------------------------------------


def test_problems_name_the_field_or_the_whole_arguments() -> None:
    with pytest.raises(ValidationError) as field:
        AddArgs.model_validate({"a": 1})
    assert tool_arguments.problems(field.value) == "`b`: Field required"
    with pytest.raises(ValidationError) as whole:
        AddArgs.model_validate([1])
    assert tool_arguments.problems(whole.value).startswith("`arguments`: ")


def test_missing_attachments_lists_the_paths() -> None:
    text = tool_arguments.missing_attachments(["/a", "/b"])
    assert text.startswith("Provided attachment path(s) not found in this thread: /a, /b. ")


# -- checks against a schema ------------------------------------------------------------------------------


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "number"}},
    "required": ["q"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"q": "a", "n": 2, "x": 1}, None),  # an integer is a number
        ({"q": "a", "x": 1.5}, None),
        ({}, "missing `q`"),
        ({"q": "a", "z": 1}, "unknown `z`"),
        ({"q": 1}, "`q` must be of type string"),
        ({"q": "a", "n": 1.5}, "`n` must be of type integer"),
        ({"q": "a", "n": True}, "`n` must be of type integer"),  # a boolean is no integer in JSON
        ({"q": "a", "x": False}, "`x` must be of type number"),
    ],
)
def test_shape_problem_checks_the_top_level_of_a_schema(arguments: dict[str, Any], problem: str | None) -> None:
    assert tool_arguments.shape_problem(SCHEMA, arguments) == problem


def test_an_open_schema_lets_unknown_arguments_through() -> None:
    assert tool_arguments.shape_problem({**SCHEMA, "additionalProperties": True}, {"q": "a", "z": 1}) is None


class _Question(BaseModel):
    q: str


def test_a_prompts_problem_uses_a_pydantic_schema_or_the_default_message_schema() -> None:
    typed = define_prompt(name="t", model="m", prompt="x", required_schema=_Question)
    assert tool_arguments.prompt_problem(typed, {"q": "a"}) is None
    assert tool_arguments.prompt_problem(typed, {}) == "`q`: Field required"
    plain = define_prompt(name="p", model="m", prompt="x")
    assert tool_arguments.prompt_problem(plain, {"message": "hi"}) is None
    assert tool_arguments.prompt_problem(plain, {"message": "hi", "attachments": ["/attachments/a.txt"]}) is None
    assert tool_arguments.prompt_problem(plain, {"message": "hi", "extra": 1}) == "unknown `extra`"
