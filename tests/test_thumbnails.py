"""Thumbnails: made once per content (however many ask at once), stored, and refused for images too large."""

from __future__ import annotations

import asyncio
import io
import struct
import threading
import time
import uuid
import zlib
from typing import Any

import pytest
from PIL import Image
from sqlalchemy import func, select

from app import catalog, files, images, tables, thumbnails
from tests.conftest import ROOT, client_for


async def _until(condition: Any, timeout: float = 10) -> None:
    """Poll a plain condition often (what it waits for takes milliseconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def _setup(app_factory: Any) -> tuple[Any, Any, str]:
    app = await app_factory(catalog.load(ROOT / "agents"))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    return app, client, tid


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "teal").save(out, "PNG")
    return out.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims `width` × `height` pixels in a few bytes (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


async def test_concurrent_requests_make_one_thumbnail_and_store_it(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, client, tid = await _setup(app_factory)
    png = _png(600, 400)  # large enough to be shrunk, small enough to make and decode in a few ms
    put = await client.put(f"/threads/{tid}/fs/big.png", content=png, headers={"content-type": "image/png"})
    assert put.status_code == 201, put.text
    made, asked = 0, 0
    original, original_get = images.thumbnail, thumbnails.get
    arrived = threading.Event()

    def counted(data: bytes, size: int = images.THUMBNAIL) -> bytes:
        nonlocal made
        made += 1
        arrived.wait(10)  # until every request has arrived: they all ask while it is being made
        return original(data, size)

    async def asking(*args: Any) -> bytes:
        nonlocal asked
        asked += 1
        return await original_get(*args)

    monkeypatch.setattr(images, "thumbnail", counted)
    monkeypatch.setattr(thumbnails, "get", asking)
    url = f"/threads/{tid}/fs/big.png"
    requests = [asyncio.create_task(client.get(url, params={"thumbnail": 1})) for _ in range(8)]
    await _until(lambda: asked == 8)
    arrived.set()
    answers = await asyncio.gather(*requests)
    assert [a.status_code for a in answers] == [200] * 8
    assert len({a.content for a in answers}) == 1 and made == 1
    with Image.open(io.BytesIO(answers[0].content)) as thumb:
        assert thumb.size == (256, 171)
    later = await client.get(url, params={"thumbnail": 1})
    assert later.status_code == 200 and later.content == answers[0].content and made == 1  # stored, not remade
    await client.put(f"/threads/{tid}/fs/same.png", content=png, headers={"content-type": "image/png"})
    assert (await client.get(f"/threads/{tid}/fs/same.png", params={"thumbnail": 1})).content == answers[0].content
    assert made == 1  # once per content, whatever the path
    async with app.state.runtime.sessions() as session:
        assert (await session.execute(select(func.count()).select_from(tables.Thumbnail))).scalar_one() == 1


@pytest.mark.parametrize(("width", "height"), [(7000, 7000), (100_000, 100_000)])
async def test_images_too_large_to_decode_are_refused_clearly(app_factory: Any, width: int, height: int) -> None:
    _app, client, tid = await _setup(app_factory)
    put = await client.put(f"/threads/{tid}/fs/bomb.png", content=_png_header(width, height))
    assert put.status_code == 201, put.text
    started = time.monotonic()
    response = await client.get(f"/threads/{tid}/fs/bomb.png", params={"thumbnail": 1})
    assert time.monotonic() - started < 1  # refused from its header, nothing decoded
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "image_too_large" and "pixels" in error["message"]


async def test_a_failed_thumbnail_is_the_same_answer_for_everyone_waiting(app_factory: Any) -> None:
    _app, client, tid = await _setup(app_factory)
    await client.put(f"/threads/{tid}/fs/fake.png", content=b"not a png", headers={"content-type": "image/png"})
    answers = await asyncio.gather(
        *[client.get(f"/threads/{tid}/fs/fake.png", params={"thumbnail": 1}) for _ in range(4)]
    )
    assert [(a.status_code, a.json()["error"]["code"]) for a in answers] == [(422, "not_an_image")] * 4


async def test_a_waiter_makes_the_thumbnail_when_its_maker_is_cancelled(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, client, tid = await _setup(app_factory)
    await client.put(f"/threads/{tid}/fs/a.png", content=_png(40, 30))
    made = 0
    original = images.thumbnail
    cancelled = threading.Event()

    def slow(data: bytes, size: int = images.THUMBNAIL) -> bytes:
        nonlocal made
        made += 1
        if made == 1:
            cancelled.wait(10)  # the maker's decode outlasts the maker
        return original(data, size)

    monkeypatch.setattr(images, "thumbnail", slow)
    async with app.state.runtime.sessions() as one, app.state.runtime.sessions() as two:
        entry = await files.stat(one, uuid.UUID(tid), "/a.png")
        maker = asyncio.create_task(thumbnails.get(one, entry))
        await _until(lambda: made == 1)  # it is making it
        waiter = asyncio.create_task(thumbnails.get(two, entry))
        await asyncio.sleep(0.05)  # the waiter finds it being made, and waits for it
        maker.cancel()
        cancelled.set()
        thumb = await waiter
    assert thumb.startswith(b"\xff\xd8") and made == 2  # made again by the waiter, not lost with its maker


async def test_requests_beyond_the_waiting_bound_are_told_to_retry(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each waiting request holds a database connection: past `MAX_WAITING` (and the slots decoding) the answer is
    503 `busy` with `Retry-After`, and nobody reads an image before it has a slot."""
    _app, client, tid = await _setup(app_factory)
    for i in range(7):
        png = _png(40 + i, 30)  # seven contents: no request can share another's thumbnail
        await client.put(f"/threads/{tid}/fs/{i}.png", content=png, headers={"content-type": "image/png"})
    monkeypatch.setattr(thumbnails, "MAX_WAITING", 2)
    decoding, most = 0, 0
    original = images.thumbnail
    refused = threading.Event()

    def slow(data: bytes, size: int = images.THUMBNAIL) -> bytes:
        nonlocal decoding, most
        decoding += 1
        most = max(most, decoding)
        refused.wait(10)  # the first decodes last until the requests beyond the bound were answered
        decoding -= 1
        return original(data, size)

    monkeypatch.setattr(images, "thumbnail", slow)
    requests = [
        asyncio.create_task(client.get(f"/threads/{tid}/fs/{i}.png", params={"thumbnail": 1})) for i in range(7)
    ]
    await _until(lambda: sum(r.done() for r in requests) >= 3)  # 7 - (2 decoding + 2 waiting)
    refused.set()
    answers = await asyncio.gather(*requests)
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) == {200, 503} and statuses.count(200) >= 4, statuses  # 2 decoding + 2 waiting at once
    busy = next(a for a in answers if a.status_code == 503)
    assert busy.json()["error"]["code"] == "busy" and busy.headers["retry-after"] == "1"
    assert most <= thumbnails.WORKERS
    again = [await client.get(f"/threads/{tid}/fs/{i}.png", params={"thumbnail": 1}) for i in range(7)]
    assert [a.status_code for a in again] == [200] * 7
