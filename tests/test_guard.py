"""The guard counts a body as it arrives, whatever the method: no route reads past the limit."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse
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
