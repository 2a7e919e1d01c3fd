"""The per-thread file tree and its content-addressed blobs, against real Postgres."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, select, text

from app import blobs, catalog, errors, files, patterns, tables
from tests.conftest import ROOT, client_for


async def _thread(app: Any) -> uuid.UUID:
    client = client_for(app)
    return uuid.UUID((await client.post("/threads", json={"agent": "assistant"})).json()["id"])


async def _count(app: Any, table: Any) -> int:
    async with app.state.runtime.sessions() as session:
        return int((await session.execute(select(func.count()).select_from(table))).scalar_one())


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/a/b.txt", "/a/b.txt"), ("a//b/./c", "/a/b/c"), ("/dir/", "/dir"), ("/", "/"), ("/ü/日本.md", "/ü/日本.md")],
)
def test_paths_are_normalised(path: str, expected: str) -> None:
    assert files.normalise(path) == expected


@pytest.mark.parametrize(
    "path", ["../etc/passwd", "/a/../../b", "/a/\x00b", "/a/\nb", "/a/\x7fb", "", "   ", "/" + "x" * 256, "/a" * 600]
)
async def test_bad_paths_are_refused_and_nothing_is_stored(app_factory: Any, path: str) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    with pytest.raises(errors.BadPath):
        async with app.state.runtime.sessions() as session, session.begin():
            await files.write_bytes(session, thread_id, path, b"secret")
    assert await _count(app, tables.File) == 0
    assert await _count(app, tables.Blob) == 0


async def test_write_read_stat_list_and_parents(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    async with app.state.runtime.sessions() as session, session.begin():
        entry = await files.write_bytes(session, thread_id, "/reports/2026/q4.md", b"# Q4\n")
        await files.write_bytes(session, thread_id, "/notes.txt", b"hello")
    assert (entry.path, entry.size, entry.mime_type) == ("/reports/2026/q4.md", 5, "text/markdown")
    async with app.state.runtime.sessions() as session:
        assert await files.read_bytes(session, thread_id, "reports/2026/q4.md") == b"# Q4\n"
        assert (await files.stat(session, thread_id, "/reports")).is_dir
        assert [e.name for e in await files.readdir(session, thread_id, "/")] == ["notes.txt", "reports"]
        assert [e.path for e in await files.readdir(session, thread_id, "/reports")] == ["/reports/2026"]
        usage = await files.usage(session, thread_id)
        assert (usage.files, usage.directories, usage.bytes) == (2, 2, 10)
        with pytest.raises(errors.FileNotFound):
            await files.stat(session, thread_id, "/missing.txt")
        with pytest.raises(errors.FileConflict):  # a directory has no bytes
            await files.read(session, thread_id, "/reports")


async def test_conflicts_between_files_and_directories(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    async with app.state.runtime.sessions() as session, session.begin():
        await files.write_bytes(session, thread_id, "/a.txt", b"x")
        await files.mkdir(session, thread_id, "/dir/sub")
    for attempt in (
        lambda s: files.write_bytes(s, thread_id, "/a.txt/inside", b"y"),  # a file as a parent
        lambda s: files.mkdir(s, thread_id, "/a.txt"),
        lambda s: files.write_bytes(s, thread_id, "/dir", b"y"),  # a directory overwritten by a file
        lambda s: files.rmdir(s, thread_id, "/dir"),  # not empty
        lambda s: files.unlink(s, thread_id, "/dir/sub"),  # a directory
    ):
        with pytest.raises(errors.FileConflict):
            async with app.state.runtime.sessions() as session, session.begin():
                await attempt(session)
    async with app.state.runtime.sessions() as session, session.begin():
        await files.rmdir(session, thread_id, "/dir/sub")
        await files.rmdir(session, thread_id, "/dir")
        await files.unlink(session, thread_id, "/a.txt")
        assert await files.readdir(session, thread_id, "/") == []


async def test_identical_content_is_stored_once_and_collected_when_unreferenced(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    one, two = await _thread(app), await _thread(app)
    data = bytes(range(256)) * 10_000  # 2.5 MB: three chunks
    async with app.state.runtime.sessions() as session, session.begin():
        a = await files.write_bytes(session, one, "/data.bin", data)
        b = await files.write_bytes(session, two, "/copy/data.bin", data)
    assert a.sha256 == b.sha256
    assert await _count(app, tables.Blob) == 1
    assert await _count(app, tables.BlobChunk) == 3
    async with app.state.runtime.sessions() as session:
        assert await files.read_bytes(session, two, "/copy/data.bin") == data
    async with app.state.runtime.sessions() as session, session.begin():
        await files.unlink(session, one, "/data.bin")
        assert await blobs.collect(session, 0) == 0  # the other thread still points at it
        await files.unlink(session, two, "/copy/data.bin")
        assert await blobs.collect(session, 3600) == 0  # within the grace period
        await session.execute(text("UPDATE blobs SET created_at = now() - interval '2 hours'"))
        assert await blobs.collect(session, 3600) == 1
    assert await _count(app, tables.BlobChunk) == 0


async def test_the_size_limit_is_enforced_while_streaming(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    pulled = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal pulled
        while True:
            pulled += 1
            yield b"x" * 65_536

    with pytest.raises(errors.TooLarge):
        async with app.state.runtime.sessions() as session, session.begin():
            await files.write(session, thread_id, "/big.bin", endless(), limit=1_000_000)
    assert pulled == 16  # refused at the first piece past the limit, not after reading everything
    assert await _count(app, tables.File) == 0
    assert await _count(app, tables.Blob) == 0


async def test_grep_and_find(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    async with app.state.runtime.sessions() as session, session.begin():
        await files.write_bytes(session, thread_id, "/notes/todo.md", b"buy milk\nTODO: call Ann\ndone\n")
        await files.write_bytes(session, thread_id, "/notes/old.txt", b"nothing here\nTODO later")
        await files.write_bytes(session, thread_id, "/bin/blob.dat", b"TODO\x00\x01binary")
        await files.write_bytes(session, thread_id, "/latin1.txt", "TODO café".encode("latin-1"))
    async with app.state.runtime.sessions() as session:
        found = await files.grep(session, thread_id, r"TODO\b")
        assert [(m.path, m.line, m.text) for m in found] == [
            ("/notes/old.txt", 2, "TODO later"),
            ("/notes/todo.md", 2, "TODO: call Ann"),
        ]
        with pytest.raises(errors.Invalid, match="regular expression"):
            await files.grep(session, thread_id, "(unclosed")
        assert [e.path for e in await files.find(session, thread_id, "*.txt")] == ["/latin1.txt", "/notes/old.txt"]
        assert [e.path for e in await files.find(session, thread_id, "/notes")] == ["/notes"]
    client = client_for(app)
    grep = await client.get(f"/threads/{thread_id}/fs", params={"grep": "call"})
    assert grep.json() == {
        "pattern": "call",
        "matches": [{"path": "/notes/todo.md", "line": 2, "text": "TODO: call Ann"}],
    }
    find = await client.get(f"/threads/{thread_id}/fs", params={"find": "notes/*"})
    assert [e["path"] for e in find.json()["entries"]] == ["/notes/old.txt", "/notes/todo.md"]
    bad = await client.get(f"/threads/{thread_id}/fs", params={"grep": "("})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


async def test_pathological_patterns_answer_at_once(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    async with app.state.runtime.sessions() as session, session.begin():
        await files.write_bytes(session, thread_id, "/" + "a" * 250 + "/" + "a" * 148, b"a" * 25 + b"!\n")
    client = client_for(app)
    started = time.monotonic()
    find = await client.get(f"/threads/{thread_id}/fs", params={"find": "/**b**b**b**b**bZ"})
    grep = await client.get(f"/threads/{thread_id}/fs", params={"grep": "(a+)+$"})
    assert time.monotonic() - started < 1
    assert (find.status_code, find.json()["entries"]) == (200, [])
    assert (grep.status_code, grep.json()["matches"]) == (200, [])


async def test_patterns_linear_matching_cannot_take_are_refused(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    client = client_for(app)
    for query, status, code in (
        ({"grep": r"(a)\1"}, 400, "unsupported_pattern"),
        ({"grep": "(?=a)"}, 400, "unsupported_pattern"),
        ({"grep": "a" * 1001}, 400, "pattern_too_long"),
        ({"find": "*" * 1001}, 400, "pattern_too_long"),
    ):
        response = await client.get(f"/threads/{thread_id}/fs", params=query)
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code and response.json()["error"]["message"]


async def test_grep_reads_a_bounded_number_of_bytes(app_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    async with app.state.runtime.sessions() as session, session.begin():
        for name in ("a", "b", "c"):
            await files.write_bytes(session, thread_id, f"/{name}.txt", f"TODO {name}\n".encode())  # 7 bytes
    monkeypatch.setattr(files, "GREP_MAX_BYTES", 14)
    async with app.state.runtime.sessions() as session:
        assert [m.path for m in await files.grep(session, thread_id, "TODO")] == ["/a.txt", "/b.txt"]
    monkeypatch.setattr(files, "GREP_MAX_FILE", 6)
    async with app.state.runtime.sessions() as session:
        assert await files.grep(session, thread_id, "TODO") == []


async def test_searches_past_their_time_budget_are_refused(app_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    async with app.state.runtime.sessions() as session, session.begin():
        await files.write_bytes(session, thread_id, "/a.txt", b"TODO\n")
    monkeypatch.setattr(files, "SEARCH_SECONDS", 0.0)
    client = client_for(app)
    for query in ({"grep": "TODO"}, {"find": "*.txt"}):
        response = await client.get(f"/threads/{thread_id}/fs", params=query)
        assert response.status_code == 422 and response.json()["error"]["code"] == "search_timeout", response.text


async def test_searches_run_off_the_event_loop(app_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    async with app.state.runtime.sessions() as session, session.begin():
        await files.write_bytes(session, thread_id, "/a.txt", b"TODO\n")

    served = threading.Event()

    def slow(*args: Any, **kwargs: Any) -> list[Any]:
        served.wait(5)  # a long match, until the event loop has served others meanwhile (it cannot, if blocked here)
        return []

    monkeypatch.setattr(patterns, "lines", slow)
    monkeypatch.setattr(patterns, "fullmatches", slow)
    for search in (files.grep, files.find):
        ticks = 0
        served.clear()

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
                if ticks == 3:
                    served.set()

        ticker = asyncio.create_task(tick())
        async with app.state.runtime.sessions() as session:
            assert await search(session, thread_id, "TODO") == []
        ticker.cancel()
        assert ticks >= 3, search


def _png(width: int, height: int, mode: str = "RGB") -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new(mode, (width, height)).save(out, "PNG")
    return out.getvalue()


async def test_thumbnail_of_a_png_and_image_dimensions(app_factory: Any) -> None:
    import io

    from PIL import Image

    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    client = client_for(app)
    put = await client.put(
        f"/threads/{thread_id}/fs/pics/wide.png", content=_png(600, 300, "RGBA"), headers={"content-type": "image/png"}
    )
    assert (put.json()["width"], put.json()["height"]) == (600, 300)
    thumb = await client.get(f"/threads/{thread_id}/fs/pics/wide.png", params={"thumbnail": 1})
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    with Image.open(io.BytesIO(thumb.content)) as image:
        assert image.format == "JPEG" and image.size == (256, 128)
    again = await client.get(
        f"/threads/{thread_id}/fs/pics/wide.png",
        params={"thumbnail": 1},
        headers={"if-none-match": thumb.headers["etag"]},
    )
    assert again.status_code == 304
    await client.put(f"/threads/{thread_id}/fs/t.txt", content=b"hi", headers={"content-type": "text/plain"})
    refused = await client.get(f"/threads/{thread_id}/fs/t.txt", params={"thumbnail": 1})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "not_an_image"
    await client.put(f"/threads/{thread_id}/fs/fake.png", content=b"not a png", headers={"content-type": "image/png"})
    assert (await client.get(f"/threads/{thread_id}/fs/fake.png", params={"thumbnail": 1})).status_code == 422
    listing = (await client.get(f"/threads/{thread_id}/fs/pics")).json()["entries"]
    assert (listing[0]["width"], listing[0]["height"]) == (600, 300)


@pytest.mark.parametrize(
    "path", ["/a\rb", "/a\u0085b", "/a\u009fb", "/a\u202eb", "/a\u2066b", "/a\u2069b", "/a\u200fb", "/a\udcffb"]
)
def test_control_bidi_and_surrogate_characters_are_refused(path: str) -> None:
    with pytest.raises(errors.BadPath):
        files.normalise(path)
