"""Refuse what no route can take before it is read: NUL, control characters or bytes that are not UTF-8 in the
URL, oversized or non-JSON bodies.

A plain ASGI middleware (not `BaseHTTPMiddleware`, which would pipe every streamed event through a memory stream).
"""

from __future__ import annotations

import re
import urllib.parse

from starlette.types import ASGIApp, Receive, Scope, Send

from app import endpoints
from app.api import errors

FILES = re.compile(r"^/threads/[^/]+/fs/")  # raw file uploads: any type, the file size limit
MESSAGES = re.compile(r"^/threads/[^/]+/messages/?$")  # JSON, or multipart with files
CUSTOM = re.compile(r"^/threads/[^/]+/([^/]+)")  # a custom thread endpoint reads whatever body it likes
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1


def _path_problem(raw_path: bytes) -> str | None:
    """Why the URL path cannot name anything: bytes that are not UTF-8 (decoded leniently, `%ff%fe` and `%fe%ff`
    would both be U+FFFD, the same name), or control characters (a CR or LF does not even reach a route)."""
    try:
        path = urllib.parse.unquote_to_bytes(raw_path).decode()
    except UnicodeDecodeError:
        return "The URL path is not valid UTF-8 once percent-decoded."
    if CONTROL.search(path):
        return "The URL path contains control characters (such as CR or LF)."
    return None


def _custom(path: str) -> bool:
    match = CUSTOM.match(path)
    return match is not None and match.group(1) not in endpoints.RESERVED


class Guard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, max_file_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_file_bytes = max_file_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ASGIApp | None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        if b"%00" in scope.get("query_string", b"") or b"%00" in raw_path or "\x00" in scope["path"]:
            return errors.envelope(400, "invalid_request", "NUL characters are not allowed in URLs.")
        problem = _path_problem(raw_path.split(b"?")[0])
        if problem is not None:
            return errors.envelope(400, "bad_path", problem)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length", "0")
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        upload = scope["method"] == "PUT" and FILES.match(scope["path"]) is not None
        multipart = (
            scope["method"] == "POST" and media == "multipart/form-data" and MESSAGES.match(scope["path"]) is not None
        )
        limit = self.max_file_bytes if upload else self.max_body_bytes
        if multipart:  # files and the other fields
            limit = self.max_file_bytes + self.max_body_bytes
        if length.isdigit() and int(length) > limit:
            return errors.envelope(413, "too_large", f"The body exceeds the limit of {limit} bytes.")
        has_body = length != "0" or "transfer-encoding" in headers
        json_body = media == "application/json" or media.endswith("+json")
        free = upload or multipart or json_body or _custom(scope["path"])
        if scope["method"] in ("POST", "PUT", "PATCH") and has_body and not free:
            return errors.envelope(
                415,
                "unsupported_media_type",
                f"Send a JSON body with `Content-Type: application/json` (got `{media or 'none'}`).",
            )
        return None
