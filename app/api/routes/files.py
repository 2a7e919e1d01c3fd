"""A thread's files: list, download (streamed), upload (raw body, streamed, size-limited) and delete."""

from __future__ import annotations

import re
import urllib.parse
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic.config import JsonDict

from app import blobs, files, patterns, threads, thumbnails
from app.api import bodies, schemas
from app.api.deps import CurrentUser, SessionDep, SessionsDep, SettingsDep

router = APIRouter(tags=["files"], route_class=bodies.Route)

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": schemas.Error},
    401: {"model": schemas.Error},
    404: {"model": schemas.Error},
    409: {"model": schemas.Error},
    422: {"model": schemas.Error},
}
# Shown in the browser: types no browser runs script in. Every other type is a download (html, svg, xml and its
# stylesheets, rfc822, multipart/x-mixed-replace, pdf, …), and every file response is sandboxed and never sniffed.
INLINE = {
    "text/plain",
    "text/markdown",
    "text/csv",
    "application/json",
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "audio/mpeg",
    "audio/ogg",
    "audio/wav",
    "audio/webm",
    "video/mp4",
    "video/webm",
    "video/ogg",
}
SANDBOX = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"}
# bounds the route's own checks enforce (400 `pattern_too_long`, 400 `bad_path`), documented here
PATTERN: JsonDict = {"maxLength": patterns.MAX_LENGTH}
FilePath = Annotated[str, Path(json_schema_extra={"maxLength": files.MAX_PATH})]
MEDIA_TYPE = re.compile(r"[\w!#$&^.+-]+/[\w!#$&^.+-]+( *;[ -~]*)?", re.ASCII)  # type/subtype, printable params


def _served_type(mime_type: str | None) -> str:
    """The stored type as a `Content-Type`, or `application/octet-stream` if it is not one (a type stored from an
    attachment's JSON could hold anything, CR and LF included)."""
    if mime_type and MEDIA_TYPE.fullmatch(mime_type):
        return mime_type
    return "application/octet-stream"


def _record(entry: files.Entry) -> schemas.FileRecord:
    record = entry.record()
    return schemas.FileRecord(etag=record.pop("sha256"), **record)


def _listing(path: str, entries: list[files.Entry]) -> schemas.FileList:
    return schemas.FileList(path=path, entries=[_record(e) for e in entries])


@router.get("/threads/{thread_id}/fs", operation_id="listFiles", responses=ERRORS, response_model=None)
async def root(
    thread_id: uuid.UUID,
    session: SessionDep,
    who: CurrentUser,
    stats: bool = False,
    grep: Annotated[
        str | None, Query(description="a regular expression: matching lines of text files", json_schema_extra=PATTERN)
    ] = None,
    find: Annotated[
        str | None, Query(description="a glob (`*.md`, `/reports/**/*.pdf`): matching paths", json_schema_extra=PATTERN)
    ] = None,
) -> schemas.FileList | schemas.FileUsage | schemas.GrepResult:
    """The root directory's entries; `?stats=1` the thread's file usage; `?grep=` or `?find=` a search."""
    thread = await threads.get(session, thread_id, who)
    if stats:
        usage = await files.usage(session, thread.id)
        return schemas.FileUsage(files=usage.files, directories=usage.directories, bytes=usage.bytes)
    if grep is not None:
        found = await files.grep(session, thread.id, grep)
        return schemas.GrepResult(
            pattern=grep, matches=[schemas.GrepMatch(path=m.path, line=m.line, text=m.text) for m in found]
        )
    if find is not None:
        return schemas.FileList(path="/", entries=[_record(e) for e in await files.find(session, thread.id, find)])
    return _listing("/", await files.readdir(session, thread.id, "/"))


DOWNLOAD: dict[int | str, dict[str, Any]] = {  # a file's own type, a JPEG thumbnail, or a directory's listing
    200: {
        "description": "The file's bytes as its stored type (or `application/octet-stream`), a JPEG with "
        "`?thumbnail=1`, or, for a directory, its listing as JSON.",
        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
    },
    304: {"description": "Not modified (`If-None-Match` names the current `ETag`)."},
}


@router.get(
    "/threads/{thread_id}/fs/{path:path}",
    operation_id="downloadFile",
    responses={**ERRORS, **DOWNLOAD},
    response_model=None,
)
async def download(
    thread_id: uuid.UUID,
    path: FilePath,
    session: SessionDep,
    sessions: SessionsDep,
    who: CurrentUser,
    if_none_match: Annotated[str | None, Header(max_length=2000)] = None,
    thumbnail: bool = False,
) -> Response:
    """A file's bytes, streamed (a directory gives its listing); `?thumbnail=1` a JPEG thumbnail of an image."""
    thread = await threads.get(session, thread_id, who)
    entry = await files.stat(session, thread.id, path)
    if entry.is_dir:
        listing = _listing(entry.path, await files.readdir(session, thread.id, entry.path))
        return JSONResponse(listing.model_dump())
    assert entry.sha256 is not None
    etag = f'"{entry.sha256}-thumb"' if thumbnail else f'"{entry.sha256}"'
    if if_none_match is not None and etag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers={"ETag": etag})
    if thumbnail:
        image = await thumbnails.get(session, entry)
        await session.commit()  # a thumbnail made now is stored for every later request
        headers = {"ETag": etag, **SANDBOX, "Cache-Control": "private, max-age=3600"}
        return Response(image, media_type="image/jpeg", headers=headers)
    mime = _served_type(entry.mime_type)
    disposition = "inline" if mime.split(";")[0].strip().lower() in INLINE else "attachment"
    headers = {
        "ETag": etag,
        "Content-Length": str(entry.size),
        "Content-Disposition": f"{disposition}; filename*=UTF-8''{urllib.parse.quote(entry.name)}",
        **SANDBOX,
    }
    return StreamingResponse(blobs.stream(sessions, entry.sha256), media_type=mime, headers=headers)


@router.put(
    "/threads/{thread_id}/fs/{path:path}",
    operation_id="uploadFile",
    status_code=201,
    responses={**ERRORS, 413: {"model": schemas.Error}},
)
async def upload(
    thread_id: uuid.UUID,
    path: FilePath,
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


@router.delete("/threads/{thread_id}/fs/{path:path}", operation_id="deleteFile", responses=ERRORS)
async def remove(thread_id: uuid.UUID, path: FilePath, session: SessionDep, who: CurrentUser) -> dict[str, str]:
    """Delete a file, or an empty directory."""
    thread = await threads.get(session, thread_id, who, lock=True)
    entry = await files.stat(session, thread.id, path)
    if entry.is_dir:
        await files.rmdir(session, thread.id, entry.path)
    else:
        await files.unlink(session, thread.id, entry.path)
    await session.commit()
    return {"deleted": entry.path}
