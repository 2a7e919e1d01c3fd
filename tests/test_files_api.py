"""`/threads/{id}/fs`: upload, download with its headers, listings, limits, refusals and ownership."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from typing import Any

import pytest
from PIL import Image
from sqlalchemy import func, select

from app import catalog, keys, tables
from tests.conftest import ROOT, client_for


async def _setup(app_factory: Any, **overrides: Any) -> tuple[Any, Any, str]:
    app = await app_factory(catalog.load(ROOT / "agents"), **overrides)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    return app, client, tid


async def _stored(app: Any) -> tuple[int, int]:
    async with app.state.runtime.sessions() as session:
        count = select(func.count())
        return (
            int((await session.execute(count.select_from(tables.File))).scalar_one()),
            int((await session.execute(count.select_from(tables.Blob))).scalar_one()),
        )


async def test_upload_download_round_trip_with_headers(app_factory: Any) -> None:
    _app, client, tid = await _setup(app_factory)
    put = await client.put(
        f"/threads/{tid}/fs/reports/q4 summary.md", content=b"# Q4\n", headers={"content-type": "text/markdown"}
    )
    assert put.status_code == 201, put.text
    record = put.json()
    assert record["path"] == "/reports/q4 summary.md" and record["type"] == "file" and record["size"] == 5
    got = await client.get(f"/threads/{tid}/fs/reports/q4 summary.md")
    assert got.status_code == 200 and got.content == b"# Q4\n"
    assert got.headers["content-type"].startswith("text/markdown")
    assert got.headers["etag"] == f'"{record["etag"]}"'
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-disposition"] == "inline; filename*=UTF-8''q4%20summary.md"
    again = await client.get(f"/threads/{tid}/fs/reports/q4 summary.md", headers={"if-none-match": got.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


@pytest.mark.parametrize(
    ("name", "mime"),
    [
        ("page.html", "text/html"),
        ("page.xhtml", "application/xhtml+xml"),
        ("logo.svg", "image/svg+xml"),
        ("a.xml", "text/xml"),
        ("b.xml", "application/xml"),
        ("guessed.xml", None),  # no Content-Type: the type guessed from `.xml`
        ("t.xsl", "application/xslt+xml"),
        ("r.rdf", "application/rdf+xml"),
        ("m.eml", "message/rfc822"),
        ("s.bin", "multipart/x-mixed-replace; boundary=x"),
        ("x.js", "text/javascript"),
        ("d.pdf", "application/pdf"),
        ("u.dat", "application/octet-stream"),
        ("odd.txt", "Text/HTML ; charset=utf-8"),
    ],
)
async def test_types_outside_the_inline_list_are_downloads(app_factory: Any, name: str, mime: str | None) -> None:
    _app, client, tid = await _setup(app_factory)
    body = b'<html xmlns="http://www.w3.org/1999/xhtml"><script>alert(1)</script></html>'
    headers = {"content-type": mime} if mime else {}
    assert (await client.put(f"/threads/{tid}/fs/{name}", content=body, headers=headers)).status_code == 201
    got = await client.get(f"/threads/{tid}/fs/{name}")
    assert got.status_code == 200 and got.headers["content-disposition"].startswith("attachment;"), got.headers
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-security-policy"] == "sandbox"


@pytest.mark.parametrize(
    ("name", "mime"),
    [("a.txt", "text/plain; charset=utf-8"), ("a.png", "image/png"), ("a.json", "application/json")],
)
async def test_plain_types_are_inline_and_sandboxed(app_factory: Any, name: str, mime: str) -> None:
    _app, client, tid = await _setup(app_factory)
    assert (await client.put(f"/threads/{tid}/fs/{name}", content=b"x", headers={"content-type": mime})).is_success
    got = await client.get(f"/threads/{tid}/fs/{name}")
    assert got.headers["content-disposition"].startswith("inline;")
    assert got.headers["content-security-policy"] == "sandbox"
    assert got.headers["x-content-type-options"] == "nosniff"


async def test_thumbnails_are_sandboxed_too(app_factory: Any) -> None:
    _app, client, tid = await _setup(app_factory)
    image = io.BytesIO()
    Image.new("RGB", (8, 8)).save(image, "PNG")
    await client.put(f"/threads/{tid}/fs/a.png", content=image.getvalue(), headers={"content-type": "image/png"})
    thumb = await client.get(f"/threads/{tid}/fs/a.png", params={"thumbnail": 1})
    assert thumb.status_code == 200 and thumb.headers["content-security-policy"] == "sandbox"
    assert thumb.headers["x-content-type-options"] == "nosniff"


async def test_a_stored_type_that_is_not_a_media_type_is_served_as_bytes(app_factory: Any) -> None:
    _app, client, tid = await _setup(app_factory)
    body = {"content": "x", "attachments": [{"name": "a.txt", "mime_type": "text/plain\r\nX-Evil: 1", "data": "aGk="}]}
    assert (await client.post(f"/threads/{tid}/messages", json=body)).status_code == 202
    [entry] = (await client.get(f"/threads/{tid}/fs/attachments")).json()["entries"]
    got = await client.get(f"/threads/{tid}/fs{entry['path']}")
    assert got.status_code == 200 and got.content == b"hi" and "x-evil" not in got.headers
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"].startswith("attachment;")


async def test_listings_directories_and_usage(app_factory: Any) -> None:
    _app, client, tid = await _setup(app_factory)
    for path in ("a.txt", "docs/b.txt", "docs/c.txt"):
        await client.put(f"/threads/{tid}/fs/{path}", content=b"xy", headers={"content-type": "text/plain"})
    root = (await client.get(f"/threads/{tid}/fs")).json()
    assert root["path"] == "/" and [(e["name"], e["type"]) for e in root["entries"]] == [
        ("a.txt", "file"),
        ("docs", "directory"),
    ]
    docs = (await client.get(f"/threads/{tid}/fs/docs")).json()
    assert [e["path"] for e in docs["entries"]] == ["/docs/b.txt", "/docs/c.txt"]
    assert (await client.get(f"/threads/{tid}/fs?stats=1")).json() == {"files": 3, "directories": 1, "bytes": 6}


@pytest.mark.parametrize(
    "path",
    [
        "a/%2e%2e/%2e%2e/etc/passwd",
        "x%01y.txt",
        "n%00ul",
        "a%0db.txt",  # CR
        "a%0ab.txt",  # LF
        "trailing%0a",
        "c1%C2%85.txt",  # U+0085, a C1 control character
        "c1%C2%9f.txt",
        "bidi%E2%80%AEtxt.exe",  # U+202E RIGHT-TO-LEFT OVERRIDE
        "bidi%E2%81%A6x.txt",  # U+2066 LEFT-TO-RIGHT ISOLATE
        "bad%ff%fe.txt",  # not UTF-8: it would decode to U+FFFD, the same name as %fe%ff
        "bad%fe%ff.txt",
        "%c3.txt",
    ],
)
async def test_bad_paths_are_refused_before_anything_is_stored(app_factory: Any, path: str) -> None:
    app, client, tid = await _setup(app_factory)
    for method in ("PUT", "GET", "DELETE"):
        response = await client.request(
            method, f"/threads/{tid}/fs/{path}", content=b"data" if method == "PUT" else None
        )
        assert response.status_code == 400, (method, path, response.text)
        assert response.json()["error"]["code"] in ("bad_path", "invalid_request")
    assert await _stored(app) == (0, 0)


async def test_the_file_size_limit_answers_413_while_streaming(app_factory: Any) -> None:
    app, client, tid = await _setup(app_factory, max_file_bytes=4096)

    async def body() -> AsyncIterator[bytes]:  # chunked: no Content-Length to refuse early
        for _ in range(10):
            yield b"x" * 1024

    streamed = await client.put(f"/threads/{tid}/fs/big.bin", content=body())
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "too_large"
    declared = await client.put(f"/threads/{tid}/fs/big.bin", content=b"x" * 5000)
    assert declared.status_code == 413
    assert await _stored(app) == (0, 0)
    small = await client.put(f"/threads/{tid}/fs/small.bin", content=b"x" * 4096)
    assert small.status_code == 201


async def test_delete_files_and_empty_directories(app_factory: Any) -> None:
    _app, client, tid = await _setup(app_factory)
    await client.put(f"/threads/{tid}/fs/docs/b.txt", content=b"b", headers={"content-type": "text/plain"})
    full = await client.delete(f"/threads/{tid}/fs/docs")
    assert full.status_code == 409 and full.json()["error"]["code"] == "file_conflict"
    assert (await client.delete(f"/threads/{tid}/fs/docs/b.txt")).json() == {"deleted": "/docs/b.txt"}
    assert (await client.get(f"/threads/{tid}/fs/docs/b.txt")).status_code == 404
    assert (await client.delete(f"/threads/{tid}/fs/docs")).json() == {"deleted": "/docs"}
    assert (await client.delete(f"/threads/{tid}/fs/docs")).json()["error"]["code"] == "file_not_found"


async def test_another_users_files_are_not_found(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    async with app.state.runtime.sessions() as s, s.begin():
        _, alice = await keys.create(s, "alice", False)
        _, bob = await keys.create(s, "bob", False)
    async with client_for(app, alice) as a, client_for(app, bob) as b:
        tid = (await a.post("/threads", json={"agent": "assistant"})).json()["id"]
        assert (await a.put(f"/threads/{tid}/fs/mine.txt", content=b"secret")).status_code == 201
        assert (await b.get(f"/threads/{tid}/fs/mine.txt")).status_code == 404
        assert (await b.get(f"/threads/{tid}/fs")).status_code == 404
        assert (await b.put(f"/threads/{tid}/fs/theirs.txt", content=b"x")).status_code == 404
        assert (await b.delete(f"/threads/{tid}/fs/mine.txt")).status_code == 404
