"""A thread's files: list, download (streamed), upload (raw body, streamed, size-limited) and delete."""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from app import blobs, files, threads
from app.api import schemas
from app.api.deps import CurrentUser, SessionDep, SettingsDep, sessions

router = APIRouter(tags=["files"])

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": schemas.Error},
    401: {"model": schemas.Error},
    404: {"model": schemas.Error},
    409: {"model": schemas.Error},
}
DOWNLOAD_ONLY = {"text/html", "application/xhtml+xml", "image/svg+xml"}  # never rendered inline from our origin


def _record(entry: files.Entry) -> schemas.FileRecord:
    return schemas.FileRecord(
        path=entry.path,
        name=entry.name,
        type="directory" if entry.is_dir else "file",
        size=entry.size,
        mime_type=entry.mime_type,
        etag=entry.sha256,
    )


def _listing(path: str, entries: list[files.Entry]) -> schemas.FileList:
    return schemas.FileList(path=path, entries=[_record(e) for e in entries])


@router.get("/threads/{thread_id}/fs", responses=ERRORS, response_model=None)
async def root(
    thread_id: uuid.UUID, session: SessionDep, who: CurrentUser, stats: bool = False
) -> schemas.FileList | schemas.FileUsage:
    """The root directory's entries; `?stats=1` the thread's file usage."""
    thread = await threads.get(session, thread_id, who)
    if stats:
        usage = await files.usage(session, thread.id)
        return schemas.FileUsage(files=usage.files, directories=usage.directories, bytes=usage.bytes)
    return _listing("/", await files.readdir(session, thread.id, "/"))


@router.get("/threads/{thread_id}/fs/{path:path}", responses=ERRORS, response_model=None)
async def download(
    thread_id: uuid.UUID,
    path: str,
    request: Request,
    session: SessionDep,
    who: CurrentUser,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """A file's bytes, streamed (a directory gives its listing)."""
    thread = await threads.get(session, thread_id, who)
    entry = await files.stat(session, thread.id, path)
    if entry.is_dir:
        listing = _listing(entry.path, await files.readdir(session, thread.id, entry.path))
        return JSONResponse(listing.model_dump())
    assert entry.sha256 is not None
    etag = f'"{entry.sha256}"'
    if if_none_match is not None and etag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers={"ETag": etag})
    media = (entry.mime_type or "application/octet-stream").split(";")[0].strip().lower()
    disposition = "attachment" if media in DOWNLOAD_ONLY else "inline"
    headers = {
        "ETag": etag,
        "Content-Length": str(entry.size),
        "Content-Disposition": f"{disposition}; filename*=UTF-8''{urllib.parse.quote(entry.name)}",
        "X-Content-Type-Options": "nosniff",
    }
    body = blobs.stream(sessions(request), entry.sha256)
    return StreamingResponse(body, media_type=entry.mime_type or "application/octet-stream", headers=headers)


@router.put("/threads/{thread_id}/fs/{path:path}", status_code=201, responses={**ERRORS, 413: {"model": schemas.Error}})
async def upload(
    thread_id: uuid.UUID,
    path: str,
    request: Request,
    session: SessionDep,
    who: CurrentUser,
    settings: SettingsDep,
) -> schemas.FileRecord:
    """Store the raw body at `path` (its `Content-Type` is the file's type), replacing a file there."""
    thread = await threads.get(session, thread_id, who)
    mime = (request.headers.get("content-type") or "").strip()[:200] or None
    entry = await files.write(session, thread.id, path, request.stream(), mime, limit=settings.max_file_bytes)
    await session.commit()
    return _record(entry)


@router.delete("/threads/{thread_id}/fs/{path:path}", responses=ERRORS)
async def remove(thread_id: uuid.UUID, path: str, session: SessionDep, who: CurrentUser) -> dict[str, str]:
    """Delete a file, or an empty directory."""
    thread = await threads.get(session, thread_id, who, lock=True)
    entry = await files.stat(session, thread.id, path)
    if entry.is_dir:
        await files.rmdir(session, thread.id, entry.path)
    else:
        await files.unlink(session, thread.id, entry.path)
    await session.commit()
    return {"deleted": entry.path}
