"""A thread's file tree (§9): absolute, normalised POSIX paths; entries are directories or files pointing at blobs.

Writing a file creates its missing parent directories; a path whose parent is a file, or a file where a directory
is needed (and the reverse), is a `FileConflict`. Bad paths are refused before anything is read or stored.
"""

from __future__ import annotations

import mimetypes
import posixpath
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app import blobs, errors, tables

MAX_PATH = 1024  # characters
MAX_SEGMENT = 255
DEFAULT_LIMIT = 50 * 1024 * 1024  # bytes per file


def normalise(path: str) -> str:
    """The canonical form of `path` (`/a/b`), or `BadPath`: no `..`, NUL, control characters or over-long names."""
    if not isinstance(path, str) or not path.strip():
        raise errors.BadPath("Give a path, such as /notes/todo.md.", path=str(path)[:100])
    if len(path) > MAX_PATH:
        raise errors.BadPath(f"The path is longer than {MAX_PATH} characters.", path=path[:100])
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise errors.BadPath(
            "The path contains NUL or control characters.", path=path.encode("unicode_escape").decode()[:100]
        )
    segments = [s for s in path.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise errors.BadPath("`..` is not allowed in paths.", path=path[:100])
    if any(len(s) > MAX_SEGMENT for s in segments):
        raise errors.BadPath(f"A path segment is longer than {MAX_SEGMENT} characters.", path=path[:100])
    return "/" + "/".join(segments)


@dataclass(frozen=True)
class Entry:
    path: str
    is_dir: bool
    size: int
    mime_type: str | None
    sha256: str | None

    @property
    def name(self) -> str:
        return posixpath.basename(self.path) or "/"

    @classmethod
    def of(cls, row: tables.File) -> Entry:
        return cls(row.path, row.is_dir, row.size, row.mime_type, row.sha256)


ROOT = Entry("/", True, 0, None, None)


async def _get(session: AsyncSession, thread_id: uuid.UUID, path: str, *, lock: bool = False) -> tables.File | None:
    query = select(tables.File).where(tables.File.thread_id == thread_id, tables.File.path == path)
    if lock:
        query = query.with_for_update()
    return (await session.execute(query)).scalar_one_or_none()


async def stat(session: AsyncSession, thread_id: uuid.UUID, path: str) -> Entry:
    """The entry at `path`; `FileNotFound` if there is none."""
    path = normalise(path)
    if path == "/":
        return ROOT
    row = await _get(session, thread_id, path)
    if row is None:
        raise errors.FileNotFound(f"No such file or directory: {path}", path=path)
    return Entry.of(row)


async def mkdir(session: AsyncSession, thread_id: uuid.UUID, path: str) -> Entry:
    """Make the directory `path` and any missing parents (an existing directory is fine)."""
    path = normalise(path)
    if path == "/":
        return ROOT
    for parent in [*_ancestors(path), path]:
        await session.execute(
            insert(tables.File).values(thread_id=thread_id, path=parent, is_dir=True).on_conflict_do_nothing()
        )
        row = await _get(session, thread_id, parent)
        if row is None or not row.is_dir:
            raise errors.FileConflict(f"{parent} is a file, not a directory.", path=parent)
    return Entry(path, True, 0, None, None)


async def write(
    session: AsyncSession,
    thread_id: uuid.UUID,
    path: str,
    body: AsyncIterable[bytes],
    mime_type: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> Entry:
    """Store `body` at `path` (replacing a file there), creating missing parent directories."""
    path = normalise(path)
    if path == "/":
        raise errors.FileConflict("/ is a directory.", path=path)
    parent = posixpath.dirname(path)
    if parent != "/":
        await mkdir(session, thread_id, parent)
    existing = await _get(session, thread_id, path, lock=True)
    if existing is not None and existing.is_dir:
        raise errors.FileConflict(f"{path} is a directory.", path=path)
    blob = await blobs.put(session, body, limit)
    mime = mime_type or mimetypes.guess_type(path)[0] or "application/octet-stream"
    values = {"sha256": blob.sha256, "size": blob.size, "mime_type": mime, "is_dir": False, "updated_at": func.now()}
    await session.execute(
        insert(tables.File)
        .values(thread_id=thread_id, path=path, **values)
        .on_conflict_do_update(index_elements=["thread_id", "path"], set_=values)
    )
    return Entry(path, False, blob.size, mime, blob.sha256)


async def write_bytes(
    session: AsyncSession, thread_id: uuid.UUID, path: str, data: bytes, mime_type: str | None = None
) -> Entry:
    async def one() -> AsyncIterator[bytes]:
        yield data

    return await write(session, thread_id, path, one(), mime_type, limit=max(DEFAULT_LIMIT, len(data)))


async def read(session: AsyncSession, thread_id: uuid.UUID, path: str) -> AsyncIterator[bytes]:
    """The file's bytes, chunk by chunk; `FileNotFound`, or `FileConflict` for a directory (raised at once)."""
    entry = await stat(session, thread_id, path)
    if entry.is_dir or entry.sha256 is None:
        raise errors.FileConflict(f"{entry.path} is a directory.", path=entry.path)
    return blobs.chunks(session, entry.sha256)


async def read_bytes(session: AsyncSession, thread_id: uuid.UUID, path: str) -> bytes:
    return b"".join([piece async for piece in await read(session, thread_id, path)])


async def readdir(session: AsyncSession, thread_id: uuid.UUID, path: str = "/") -> list[Entry]:
    """The entries directly inside the directory `path`, by name."""
    entry = await stat(session, thread_id, path)
    if not entry.is_dir:
        raise errors.FileConflict(f"{entry.path} is a file, not a directory.", path=entry.path)
    prefix = "/" if entry.path == "/" else entry.path + "/"
    rows = await session.execute(
        select(tables.File)
        .where(
            tables.File.thread_id == thread_id,
            tables.File.path.startswith(prefix, autoescape=True),
            func.strpos(func.substr(tables.File.path, len(prefix) + 1), "/") == 0,  # direct children only
        )
        .order_by(tables.File.path)
    )
    return [Entry.of(r) for r in rows.scalars()]


async def unlink(session: AsyncSession, thread_id: uuid.UUID, path: str) -> None:
    """Delete the file at `path` (its blob is collected later if nothing else points at it)."""
    entry = await stat(session, thread_id, path)
    if entry.is_dir:
        raise errors.FileConflict(f"{entry.path} is a directory: remove it with rmdir.", path=entry.path)
    await session.execute(delete(tables.File).where(tables.File.thread_id == thread_id, tables.File.path == entry.path))


async def rmdir(session: AsyncSession, thread_id: uuid.UUID, path: str) -> None:
    """Delete the empty directory `path`."""
    entry = await stat(session, thread_id, path)
    if not entry.is_dir or entry.path == "/":
        raise errors.FileConflict(f"{entry.path} is not a directory that can be removed.", path=entry.path)
    if await readdir(session, thread_id, entry.path):
        raise errors.FileConflict(f"{entry.path} is not empty.", path=entry.path)
    await session.execute(delete(tables.File).where(tables.File.thread_id == thread_id, tables.File.path == entry.path))


@dataclass(frozen=True)
class Usage:
    files: int
    directories: int
    bytes: int


async def usage(session: AsyncSession, thread_id: uuid.UUID) -> Usage:
    """How many files and directories the thread has, and the bytes its files hold."""
    row = (
        await session.execute(
            select(
                func.count().filter(~tables.File.is_dir),
                func.count().filter(tables.File.is_dir),
                func.coalesce(func.sum(tables.File.size), 0),
            ).where(tables.File.thread_id == thread_id)
        )
    ).one()
    return Usage(int(row[0]), int(row[1]), int(row[2]))


def _ancestors(path: str) -> list[str]:
    """`/a/b/c` → [`/a`, `/a/b`]."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
