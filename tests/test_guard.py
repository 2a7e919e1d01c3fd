"""The guard (`app/api/guard.py`): URLs that name nothing, body limits per route and media, and a body counted as it
arrives, whatever the method (no route reads past the limit)."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.types import Message, Receive, Scope, Send

from app.api.guard import Guard


async def _reads_its_body(scope: Scope, receive: Receive, send: Send) -> None:
    body = await Request(scope, receive).body()
    await PlainTextResponse(f"read {len(body)}")(scope, receive, send)


async def _call(method: str, chunks: list[bytes]) -> list[Message]:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": "/threads/x/report",
        "raw_path": b"/threads/x/report",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")],
    }
    await Guard(_reads_its_body, max_body_bytes=1024, max_file_bytes=4096)(scope, receive, send)
    return sent


async def test_a_chunked_body_past_the_limit_is_cut_off_for_any_method() -> None:
    for method in ("GET", "DELETE", "POST", "PUT", "PATCH"):
        sent = await _call(method, [b"x" * 600, b"x" * 600, b"x" * 600])
        assert sent[0]["status"] == 413, method
        assert b'"too_large"' in sent[1]["body"]
        fits = await _call(method, [b"x" * 600, b"x" * 400])
        assert (fits[0]["status"], fits[1]["body"]) == (200, b"read 1000"), method


GUARD = Guard(_reads_its_body, max_body_bytes=1000, max_file_bytes=50_000)


def _scope(method: str, path: bytes, *headers: tuple[bytes, bytes], query: bytes = b"") -> dict[str, Any]:
    """An HTTP scope as the server hands it over: `path` decoded as Starlette would, `raw_path` as sent."""
    decoded = urllib.parse.unquote_to_bytes(path).decode("utf-8", "replace")
    return {
        "type": "http",
        "method": method,
        "path": decoded,
        "raw_path": path,
        "query_string": query,
        "headers": list(headers),
    }


def _refused(scope: dict[str, Any]) -> tuple[int, str] | None:
    """The status and error code the guard answers with instead of the app, or None when it lets the request in."""
    refusal = GUARD.refusal(scope)
    if refusal is None:
        return None
    assert isinstance(refusal, JSONResponse)
    return refusal.status_code, json.loads(bytes(refusal.body))["error"]["code"]


JSON = (b"content-type", b"application/json")


@pytest.mark.parametrize(
    ("method", "path", "content_type", "limit"),
    [
        ("PUT", b"/threads/t/fs/notes/a.bin", b"application/octet-stream", 50_000),  # a file upload
        ("POST", b"/threads/t/fs/notes/a.bin", b"application/json", 1000),  # only PUT uploads
        ("POST", b"/threads/t/messages", b"multipart/form-data; boundary=x", 51_000),  # files and fields
        ("POST", b"/threads/t/messages/", b"Multipart/Form-Data", 51_000),
        ("POST", b"/threads/t/messages", b"application/json", 1000),
        ("POST", b"/threads/t/report", b"multipart/form-data", 1000),  # multipart elsewhere: the body limit
    ],
)
def test_the_limit_depends_on_the_route_and_media(method: str, path: bytes, content_type: bytes, limit: int) -> None:
    assert GUARD.limit(_scope(method, path, (b"content-type", content_type))) == limit


@pytest.mark.parametrize(
    ("path", "query", "code"),
    [
        (b"/threads/%00", b"", "invalid_request"),
        (b"/threads", b"name=%00", "invalid_request"),
        (b"/threads/%ff%fe", b"", "bad_path"),  # not UTF-8 once decoded
        (b"/threads/a%0d%0aSet-Cookie", b"", "bad_path"),  # CR LF
        (b"/threads/a%c2%85b", b"", "bad_path"),  # a C1 control (NEL)
    ],
)
def test_a_url_that_can_name_nothing_is_refused(path: bytes, query: bytes, code: str) -> None:
    assert _refused(_scope("GET", path, query=query)) == (400, code)


def test_a_percent_encoded_non_ascii_path_is_let_in() -> None:
    assert _refused(_scope("GET", b"/threads/caf%c3%a9")) is None


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    assert _refused(_scope("POST", b"/threads", JSON, (b"content-length", b"1001"))) == (413, "too_large")
    assert _refused(_scope("POST", b"/threads", JSON, (b"content-length", b"1000"))) is None
    upload = _scope("PUT", b"/threads/t/fs/big", (b"content-length", b"40000"))
    assert _refused(upload) is None  # a file may be larger than a JSON body


@pytest.mark.parametrize(
    ("method", "path", "headers", "allowed"),
    [
        ("POST", b"/threads", [(b"content-type", b"text/plain"), (b"content-length", b"5")], False),
        ("POST", b"/threads", [(b"content-type", b"application/problem+json"), (b"content-length", b"5")], True),
        ("POST", b"/threads", [(b"content-length", b"0")], True),  # no body, no media type needed
        ("POST", b"/threads", [(b"transfer-encoding", b"chunked")], False),  # a body without a type
        ("DELETE", b"/threads/t", [(b"content-type", b"text/plain"), (b"content-length", b"5")], True),
        ("POST", b"/threads/t/report", [(b"content-type", b"text/csv"), (b"content-length", b"5")], True),  # custom
        ("POST", b"/threads/t/stop", [(b"content-type", b"text/plain"), (b"content-length", b"5")], False),  # reserved
    ],
)
def test_bodies_must_be_json_except_where_a_route_takes_anything(
    method: str, path: bytes, headers: list[tuple[bytes, bytes]], allowed: bool
) -> None:
    refused = _refused(_scope(method, path, *headers))
    assert refused is None if allowed else refused == (415, "unsupported_media_type")
