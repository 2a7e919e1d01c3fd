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
    """Raise `BadText` if the JSON `body` decodes to a string with an unpaired surrogate (pairs are fine)."""
    if _SURROGATE.search(body) is None:
        return
    try:
        value = json.loads(body)
    except ValueError:
        return  # not JSON: the route's own parsing answers
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise errors.BadText() from None


def loads(text: str | bytes) -> Any:
    """`json.loads`, refusing unpaired surrogates (for JSON carried in form fields)."""
    check(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    return json.loads(text)


class Route(APIRoute):
    """A route whose JSON body is checked before FastAPI parses it (outside FastAPI's parsing, which would turn
    any error into a generic 400)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            media = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if media == "application/json" or media.endswith("+json"):
                check(await request.body())
            return await handler(request)

        return checked
