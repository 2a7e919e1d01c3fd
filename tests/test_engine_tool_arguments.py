"""A tool call's arguments (`app/engine/tool_arguments.py`): parsing, and the error texts the model sees."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from app.engine import tool_arguments


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


# -- error texts ---------------------------------------------------------------------------------------


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
