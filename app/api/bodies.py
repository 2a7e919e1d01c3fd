"""JSON bodies are refused when they hold text no store can keep: an unpaired UTF-16 surrogate (`"\\ud800"`, or
its raw bytes, which Python's JSON decoder lets through) decodes to a `str` that UTF-8 cannot encode, so Postgres
would fail mid-request. The check costs a byte scan; only a body with a surrogate escape is decoded twice."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from app import errors

_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")  # an escaped or raw UTF-16 surrogate


def check(body: bytes) -> None:
    """Raise `BadText` if the JSON `body` is not UTF-8 (RFC 8259 §8.1; Python's decoder also takes UTF-16 and
    UTF-32, which the byte scan cannot see into) or decodes to a string with an unpaired surrogate (pairs are fine)."""
    if body and json.detect_encoding(body) != "utf-8":
        raise errors.BadText("JSON must be encoded as UTF-8 (without a byte order mark).")
    if _SURROGATE.search(body) is None:
        return
    try:
        value = json.loads(body)
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise errors.BadText() from None
    except (ValueError, RecursionError):
        return  # not JSON, or too deep: the route's own parsing answers


def loads(text: str) -> Any:
    """`json.loads`, refusing unpaired surrogates (for JSON carried in form fields); `ValueError` if it is not
    JSON or nests too deep."""
    check(text.encode("utf-8", "surrogatepass"))
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

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        if self.body_field is None and "requestBody" not in (self.openapi_extra or {}):
            return handler  # takes no JSON body (the files' uploads are bytes of any kind)

        async def checked(request: Request) -> Response:
            media = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if media == "application/json" or media.endswith("+json"):
                check(await request.body())
            return await handler(request)

        return checked
