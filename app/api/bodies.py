"""The one JSON policy of request bodies (and of JSON carried in form fields), checked before anything parses them.

Refused: text no store can keep, since an unpaired UTF-16 surrogate (`"\\ud800"`, or its raw bytes, which Python's
JSON decoder lets through) decodes to a `str` that UTF-8 cannot encode, so Postgres would fail mid-request; and
numbers JSON cannot carry (`NaN`, `Infinity`, or a literal past a double's range such as `1e400`, which Python's
decoder reads as an infinity): Postgres' `json` refuses them too. Each check costs a byte scan; only a body the scan
flags is decoded once more.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from app import errors

_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")  # an escaped or raw UTF-16 surrogate
# what could be a number no double holds: a constant Python's decoder takes, a 3-digit exponent, 309+ digits (the
# largest double has 309); text in strings matches too, and is let through by the decoding that follows
_NUMBER = re.compile(rb"NaN|Infinity|[eE][+-]?[0-9]{3}|[0-9]{309}")
_DIGITS = len(str(int(sys.float_info.max)))


def check(body: bytes, at: str = "") -> None:
    """Raise `BadText` if the JSON `body` is not UTF-8 (RFC 8259 §8.1; Python's decoder also takes UTF-16 and
    UTF-32, which the byte scan cannot see into) or decodes to a string with an unpaired surrogate (pairs are fine);
    `BadNumber`, naming the field (under `at`), if it holds a number that is not finite or past a double's range."""
    if body and json.detect_encoding(body) != "utf-8":
        raise errors.BadText("JSON must be encoded as UTF-8 (without a byte order mark).")
    if _NUMBER.search(body) is not None:
        _numbers(body, at)
    if _SURROGATE.search(body) is None:
        return
    try:
        value = json.loads(body)
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise errors.BadText() from None
    except (ValueError, RecursionError):
        return  # not JSON, or too deep: the route's own parsing answers


class _Bad(str):
    """A number literal no double holds, in place of its value."""


def _float(literal: str) -> float | _Bad:
    value = float(literal)
    return value if math.isfinite(value) else _Bad(literal)


def _int(literal: str) -> int | _Bad:
    if len(literal.lstrip("-")) > _DIGITS:  # before `int`: Python refuses to convert more than 4300 digits
        return _Bad(literal)
    value = int(literal)
    return value if abs(value) <= sys.float_info.max else _Bad(literal)


def _numbers(body: bytes, at: str) -> None:
    """Raise `BadNumber` for the first number of `body` that is not finite or past a double's range."""
    try:
        value = json.loads(body, parse_constant=_Bad, parse_float=_float, parse_int=_int)
    except (ValueError, RecursionError):
        return  # not JSON, or too deep: the route's own parsing answers
    stack: list[tuple[tuple[str, ...], Any]] = [((at,) if at else (), value)]
    while stack:  # depth-first, in document order, without recursion (the value may nest deep)
        path, item = stack.pop()
        if isinstance(item, _Bad):
            field = ".".join(path)
            shown = item if len(item) <= 40 else f"{item[:20]}… ({len(item)} characters)"
            message = f"{shown} is not a finite number a double can hold"
            raise errors.BadNumber(
                f"Invalid request: {field or 'body'}: {message}",
                problems=[{"field": field, "message": message, "type": "finite_number"}],
            )
        if isinstance(item, dict):
            stack.extend(((*path, str(k)), v) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend(((*path, str(i)), v) for i, v in reversed(list(enumerate(item))))


def loads(text: str, at: str = "") -> Any:
    """`json.loads`, with the body's policy (for JSON carried in form field `at`); `ValueError` if it is not JSON
    or nests too deep."""
    check(text.encode("utf-8", "surrogatepass"), at)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def text(value: str) -> str:
    """A form field's text, refusing unpaired surrogates (a part's charset can decode to them)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise errors.BadText() from None
    return value


class Route(APIRoute):
    """A route whose JSON body is checked before FastAPI parses it (outside FastAPI's parsing, which would turn
    any error into a generic 400)."""

    reads_body = False  # whether the handler reads the body itself (as JSON when that is its type)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        if not self.reads_body and self.body_field is None and "requestBody" not in (self.openapi_extra or {}):
            return handler  # takes no JSON body (the files' uploads are bytes of any kind)

        async def checked(request: Request) -> Response:
            media = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if media == "application/json" or media.endswith("+json"):
                check(await request.body())
            return await handler(request)

        return checked


class OwnBody(Route):
    """A route whose handler reads the body itself (custom endpoints): a JSON body meets the same policy."""

    reads_body = True
