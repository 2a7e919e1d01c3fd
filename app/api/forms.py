"""Multipart bodies, taken whole or not at all.

Starlette's parser (python-multipart underneath) returns whatever parts it saw when the body stops, even before the
closing boundary: a cut-off upload would be stored as a shorter message. This one refuses a body that ends early.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from app import errors


class _Whole(MultiPartParser):
    """Records the closing boundary (python-multipart calls `on_end` there, and only there)."""

    ended = False

    def on_end(self) -> None:
        self.ended = True


@asynccontextmanager
async def multipart(request: Request, *, max_files: int, max_fields: int) -> AsyncIterator[FormData]:
    """The request's multipart form, its files closed on exit; `BadMultipart` if the body is malformed or ends
    before its closing boundary."""
    if not _utf8(request.headers.get("content-type", "")):  # other charsets can decode to unpaired surrogates
        raise errors.BadMultipart("A multipart body's text must be UTF-8 (drop the `charset` parameter).")
    parser = _Whole(request.headers, request.stream(), max_files=max_files, max_fields=max_fields)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise errors.BadMultipart(f"The multipart body is not valid: {exc.message}") from None
    if not parser.ended:
        for file in parser._files_to_close_on_error:  # a part cut off is in no field: close every file opened
            file.close()
        raise errors.BadMultipart("The multipart body ends before its closing boundary: it was cut off.")
    try:
        yield form
    finally:
        await form.close()


def _utf8(content_type: str) -> bool:
    """Whether the `charset` parameter is absent or names UTF-8."""
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            try:
                return codecs.lookup(value.strip().strip('"')).name == "utf-8"
            except LookupError:
                return False
    return True
