"""`app.errors`: how pydantic's validation errors are spelled in every message that reports them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from app import errors


class Item(BaseModel):
    name: str


class Order(BaseModel):
    items: list[Item]
    count: int


def found(value: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Order.model_validate(value)
    return caught.value


def test_each_problem_is_its_dotted_field_and_message() -> None:
    exc = found({"items": [{"name": 1}], "count": "x"})
    assert errors.problems(exc.errors()) == (
        "items.0.name: Input should be a valid string; count: Input should be a valid integer, unable to parse "
        "string as an integer"
    )
    assert errors.problems(exc.errors(), spell=str.upper).startswith("ITEMS.0.NAME: ")


def test_the_value_itself_is_named_by_whole_and_skipped_parts_are_left_out() -> None:
    assert errors.problems(found("nope").errors(), whole="arguments", spell=lambda f: f"`{f}`") == (
        "`arguments`: Input should be a valid dictionary or instance of Order"
    )
    located: list[dict[str, Any]] = [{"loc": ("body", "items", 0), "msg": "bad"}, {"loc": ("body",), "msg": "worse"}]
    assert errors.field(("body", "items", 0), skip=("body",)) == "items.0"
    assert errors.problems(located, whole="body", skip=("body",)) == "items.0: bad; body: worse"
