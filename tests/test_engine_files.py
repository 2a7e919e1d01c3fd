"""The file methods of `ThreadState` (§9, §12), on a state outside the thread's execution and from a tool."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from app import catalog, errors
from tests.conftest import ROOT, client_for
from tests.test_state import outside


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (300, 600), "green").save(out, "PNG")
    return out.getvalue()


async def test_every_file_method(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    tid = (await client_for(app).post("/threads", json={"agent": "assistant"})).json()["id"]
    state = await outside(app, tid)

    record = await state.write_file("/reports/weekly.md", "# Week\nTODO: ship\n", "text/markdown")
    assert (record.path, record.name, record.type, record.size, record.mime_type) == (
        "/reports/weekly.md", "weekly.md", "file", 18, "text/markdown",
    )  # fmt: skip
    assert await state.read_file("/reports/weekly.md") == b"# Week\nTODO: ship\n"
    assert await state.read_file("/nope") is None and await state.read_file("/reports") is None
    stream = await state.read_file_stream("/reports/weekly.md")
    assert stream is not None and b"".join([piece async for piece in stream]) == b"# Week\nTODO: ship\n"
    assert await state.read_file_stream("/nope") is None
    assert (await state.stat_file("/reports")).type == "directory"  # type: ignore[union-attr]
    assert await state.stat_file("/missing") is None
    assert (await state.mkdir_file("/empty/inner")).type == "directory"
    listing = await state.readdir_file("/")
    assert (listing.path, [e.name for e in listing.entries]) == ("/", ["empty", "reports"])
    picture = await state.write_file("/pics/p.png", _png())
    assert (picture.mime_type, picture.width, picture.height) == ("image/png", 300, 600)
    thumbnail = await state.get_file_thumbnail("/pics/p.png")
    assert thumbnail is not None and Image.open(io.BytesIO(thumbnail)).size == (128, 256)
    assert await state.get_file_thumbnail("/reports/weekly.md") is None
    assert await state.get_file_thumbnail("/missing.png") is None
    assert [(m.path, m.line) for m in await state.grep_files("TODO")] == [("/reports/weekly.md", 2)]
    found = await state.find_files("*.md")
    assert (found.pattern, [e.path for e in found.entries]) == ("*.md", ["/reports/weekly.md"])
    stats = await state.get_file_stats()
    assert (stats.files, stats.directories) == (2, 4) and stats.bytes == 18 + picture.size

    with pytest.raises(errors.FileConflict):
        await state.rmdir_file("/empty")  # not empty
    await state.rmdir_file("/empty/inner")
    await state.rmdir_file("/empty")
    await state.unlink_file("/reports/weekly.md")
    with pytest.raises(errors.FileNotFound):
        await state.unlink_file("/reports/weekly.md")
    with pytest.raises(errors.BadPath):
        await state.write_file("/../etc/passwd", "x")
    with pytest.raises(errors.Invalid):
        await state.write_file("/x", 42)  # type: ignore[arg-type]
    assert [e.name for e in (await state.readdir_file("/")).entries] == ["pics", "reports"]


async def test_the_example_assistant_writes_a_report_file(app_factory: Any) -> None:
    from tests.test_attachments import settle

    app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "What is 6 * 7?"})
    await settle(client, tid)
    await client.post(f"/threads/{tid}/messages", json={"content": "Please write a report."})
    await settle(client, tid)
    last = (await client.get(f"/threads/{tid}/messages")).json()["messages"][-1]
    assert last["content"].startswith("I wrote the report to /reports/conversation-report.md")
    report = await client.get(f"/threads/{tid}/fs/reports/conversation-report.md")
    assert report.headers["content-type"].startswith("text/markdown")
    assert report.text.splitlines()[:3] == ["# Conversation report", "", "- **user**: What is 6 * 7?"]
    assert "- **assistant**: The answer is 42." in report.text
