"""Refuse what no route can take before it is read: NUL, control characters or bytes that are not UTF-8 in the
URL, oversized or non-JSON bodies.

A plain ASGI middleware (not `BaseHTTPMiddleware`, which would pipe every streamed event through a memory stream).
The size limit is checked twice: against `Content-Length` before the body is read, and against the bytes as they
arrive (a chunked body has no length), so no route ever reads more than the limit.
"""

from __future__ import annotations

import re
import urllib.parse

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import routing
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
    return match is not None and match.group(1) not in routing.RESERVED


class _Overflow(HTTPException):
    """Raised into the route reading the body; an `HTTPException` so FastAPI's body parsing lets it through."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"The body exceeds the limit of {limit} bytes.")


def _too_large(limit: int) -> ASGIApp:
    return errors.envelope(413, "too_large", f"The body exceeds the limit of {limit} bytes.")


class Guard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, max_file_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_file_bytes = max_file_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.counted(scope, receive, send, self.limit(scope))  # any method: a GET may carry a body too

    async def counted(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Run the app on a body counted as it arrives; past `limit`, the route's read fails and the client gets
        413, whatever the route made of the failure."""
        received = 0
        over = started = False

        async def counting_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise _Overflow(limit)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over:  # the route's own answer to the failed read is replaced by the 413
                if not started:
                    started = True
                    await _too_large(limit)(scope, receive, send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not over or started:
                raise
            await _too_large(limit)(scope, receive, send)

    def limit(self, scope: Scope) -> int:
        """The largest body this route may be sent."""
        upload = scope["method"] == "PUT" and FILES.match(scope["path"]) is not None
        if upload:
            return self.max_file_bytes
        headers = dict(scope["headers"])
        media = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if scope["method"] == "POST" and media == "multipart/form-data" and MESSAGES.match(scope["path"]):
            return self.max_file_bytes + self.max_body_bytes  # files and the other fields
        return self.max_body_bytes

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
        limit = self.limit(scope)
        if length.isdigit() and int(length) > limit:
            return _too_large(limit)
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
