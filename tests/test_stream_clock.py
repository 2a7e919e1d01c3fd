"""A stream's clock and its ends, kept without a task or timer per stream (the hub's one ticker reads every
subscription's clock): a quiet stream is kept alive and a busy one is not pinged, a client that hangs up releases its
stream at once, the process stopping ends every stream cleanly, and frames are the SSE that sse-starlette wrote."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest
from sse_starlette import ServerSentEvent

from app import hub
from app.api.routes import events as route
from tests.conftest import wait_for
from tests.test_stream import Serve, catalog, lagging_stream, mark, read_to_end, serve

__all__ = ["serve"]  # the fixture, used by name


async def _open(app: Any, base: str) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    reader, writer = await lagging_stream(base, f"/threads/{tid}/events")
    await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 1), interval=0.01)
    return tid, reader, writer


async def _chunks(reader: asyncio.StreamReader, seconds: float, stop: int = 0) -> list[bytes]:
    """The body chunks read within `seconds` (or the first `stop` of them)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and (not stop or len(chunks) < stop):
        try:
            size = int(await asyncio.wait_for(reader.readline(), left), 16)
        except TimeoutError:
            break
        chunks.append((await reader.readexactly(size + 2))[:-2])
    return chunks


async def test_a_quiet_stream_is_kept_alive_and_a_busy_one_is_not_pinged(
    app_factory: Any, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(route, "KEEPALIVE_SECONDS", 0.4)
    monkeypatch.setattr(hub, "TICK", 0.05)
    app = await app_factory(catalog([]))
    await asyncio.sleep(1.1)  # the ticker's first sleep (at the old `TICK`) is over
    tid, reader, writer = await _open(app, await serve(app))
    try:
        quiet = await _chunks(reader, 1.5)
        assert 2 <= quiet.count(route.PING) <= 4 and set(quiet) == {route.PING}, quiet
        for i in range(12):  # an event every 0.1 s: never quiet for 0.4 s
            await mark(app, tid, i=i)
            await asyncio.sleep(0.1)
        busy = await _chunks(reader, 0.1)
        assert busy and route.PING not in busy and b"".join(busy).count(b"event: event") == 12, busy
    finally:
        writer.close()


async def test_a_client_that_hangs_up_releases_its_stream_at_once(app_factory: Any, serve: Serve) -> None:
    app = await app_factory(catalog([]))
    _, _, writer = await _open(app, await serve(app))
    started = time.monotonic()
    writer.close()
    await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 0), interval=0.01)
    assert time.monotonic() - started < 1  # not at the next keepalive (15 s) or send


async def test_the_process_stopping_ends_every_stream_cleanly(app_factory: Any, serve: Serve) -> None:
    app = await app_factory(catalog([]))
    base = await serve(app)
    tid, reader, writer = await _open(app, base)
    seq = await mark(app, tid, i=0)
    [sent] = await _chunks(reader, 5, stop=1)
    assert f"id: {seq}\r\n".encode() in sent
    app.state.runtime.stopping.set()
    assert await asyncio.wait_for(read_to_end(reader), 5) == []  # the body ended (its last chunk), not cut off
    writer.close()
    late_reader, late_writer = await lagging_stream(base, f"/threads/{tid}/events")  # opened while stopping
    assert [int(f["id"]) for f in await asyncio.wait_for(read_to_end(late_reader), 5)] == [seq]
    late_writer.close()
    await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 0), interval=0.01)


@pytest.mark.parametrize(
    ("seq", "type_", "text"),
    [(7, "message_data", '{"a": "b\\nc"}'), (None, "message_chunk", '{"chunk": "é"}'), (1, "x", "two\nlines\r\n3")],
)
def test_frames_are_the_sse_that_sse_starlette_writes(seq: int | None, type_: str, text: str) -> None:
    expected = ServerSentEvent(id=None if seq is None else str(seq), event=type_, data=text).encode()
    assert route._frame(seq, type_, text) == expected


def test_a_stuck_send_cancels_its_stream_once_and_a_quiet_one_is_pinged_once() -> None:
    async def check() -> None:
        sub = hub.Subscription(uuid.uuid4(), 10, keepalive=5, send_timeout=2)
        sub.task = asyncio.current_task()
        now = asyncio.get_running_loop().time()
        sub.tick(now + 4)
        assert not sub.ping
        sub.tick(now + 5)
        sub.tick(now + 6)
        assert sub.ping
        sub.sending_since = now + 10
        sub.tick(now + 11.9)
        assert not sub.timed_out
        sub.tick(now + 12)
        sub.tick(now + 13)  # cancelled once only
        assert sub.timed_out
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 1
        task.uncancel()

    asyncio.run(check())
