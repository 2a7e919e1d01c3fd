"""Server-sent events as the providers read them: the `data` of every event a network read completes.

httpx's `aiter_lines` decodes each read to text and splits it into lines, through two more generators and a list
per read; a provider needs nothing but the `data` lines. So the bytes are split here, a read at a time, and every
event the read completes comes out in one batch: a read that carries several chunks (a fast model, a busy
connection) is handed on as one, its deltas merged (`merge`). Line ends may be `\\n`, `\\r\\n` or `\\r`; comment
lines (keep-alives) and fields other than `data` are skipped
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx

from app.llm.base import ReasoningDelta, StreamEvent, TextDelta

REST_SECONDS = 1.0  # how long what follows a stream's last event is read before the connection is dropped


async def batches(response: httpx.Response) -> AsyncIterator[list[str]]:
    """The `data` of the events each read completes (reads that complete none yield nothing); at the end of the body,
    an event not followed by its blank line. What a read completes is decoded once (UTF-8, as the format is), not
    event by event: `json.loads` of bytes would detect their encoding and decode each."""
    pending = b""
    async for read in response.aiter_bytes():
        buffer = pending + read if pending else read
        held = b"\r" if buffer.endswith(b"\r") else b""  # maybe the first half of a `\r\n`: decided by the next read
        if held:
            buffer = buffer[:-1]
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = buffer.rfind(b"\n\n")
        if cut < 0:
            pending = buffer + held
            continue
        pending = buffer[cut + 2 :] + held
        found = [data for block in _text(buffer[:cut]).split("\n\n") if (data := _data(block)) is not None]
        if found:
            yield found
    last = _data(_text(pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n").strip(b"\n")))
    if last is not None:
        yield [last]


async def rest(reads: AsyncIterator[list[str]]) -> None:
    """Read the body after the stream's last event (`[DONE]`, `message_stop`): normally nothing but its end, in the
    same read. A response read to its end gives its connection back to the pool; one closed before drops it, and the
    next call opens another (a TCP and a TLS handshake). A server that keeps it open is left after `REST_SECONDS`."""
    with contextlib.suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(REST_SECONDS):
            async for _ in reads:
                pass


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _data(block: str) -> str | None:
    """The `data` of one event (its lines joined by `\\n`), or None when it has none."""
    if block.startswith("data:") and "\n" not in block:  # the usual event: one line
        return block[6:] if block.startswith("data: ") else block[5:]
    lines = [line[6:] if line.startswith("data: ") else line[5:] for line in block.split("\n") if line[:5] == "data:"]
    return "\n".join(lines) if lines else None


def merge(out: list[StreamEvent], kind: type[TextDelta] | type[ReasoningDelta], text: str) -> None:
    """Add a delta to a read's batch: a delta of the same kind just before it takes the text instead."""
    last = out[-1] if out else None
    if type(last) is kind:
        assert isinstance(last, TextDelta | ReasoningDelta)
        last.text += text
    else:
        out.append(kind(text))
