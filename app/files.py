"""A thread's file tree (§9): absolute, normalised POSIX paths; entries are directories or files pointing at blobs.

Writing a file creates its missing parent directories; a path whose parent is a file, or a file where a directory
is needed (and the reverse), is a `FileConflict`. Bad paths are refused before anything is read or stored.
"""

from __future__ import annotations

import asyncio
import mimetypes
import posixpath
import re
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app import blobs, errors, images, patterns, tables

MAX_PATH = 1024  # characters
MAX_SEGMENT = 255
DEFAULT_LIMIT = 50 * 1024 * 1024  # bytes per file


# C0 and C1 controls and DEL; bidi marks, embeddings, overrides and isolates (a name that reads backwards:
# https://unicode.org/reports/tr9/#Explicit_Directional_Formatting_Characters); lone surrogates (not UTF-8)
T = TypeVar("T")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def normalise(path: str) -> str:
    """The canonical form of `path` (`/a/b`), or `BadPath`: no `..`, NUL, control or bidi characters, over-long
    names."""
    if not isinstance(path, str) or not path.strip():
        raise errors.BadPath("Give a path, such as /notes/todo.md.", path=str(path)[:100])
    if len(path) > MAX_PATH:
        raise errors.BadPath(f"The path is longer than {MAX_PATH} characters.", path=path[:100])
    if _UNSAFE.search(path):
        raise errors.BadPath(
            "The path contains NUL, control, bidirectional-override or surrogate characters.",
            path=path.encode("unicode_escape").decode()[:100],
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
    width: int | None = None
    height: int | None = None

    @property
    def name(self) -> str:
        return posixpath.basename(self.path) or "/"

    def record(self) -> dict[str, Any]:
        """The entry as a file record shows it, to a tool (`FileRecord`) or over HTTP (which names `sha256` `etag`)."""
        return {
            "path": self.path,
            "name": self.name,
            "type": "directory" if self.is_dir else "file",
            "size": self.size,
            "mime_type": self.mime_type,
            "sha256": self.sha256,
            "width": self.width,
            "height": self.height,
        }

    @classmethod
    def of(cls, row: tables.File) -> Entry:
        return cls(row.path, row.is_dir, row.size, row.mime_type, row.sha256, row.width, row.height)


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
    size = images.dimensions(blob.head) if images.is_image(mime) else None
    width, height = size or (None, None)
    return await _put(session, thread_id, Entry(path, False, blob.size, mime, blob.sha256, width, height))


async def _put(session: AsyncSession, thread_id: uuid.UUID, entry: Entry) -> Entry:
    """Point the file entry `entry.path` at its blob (replacing what was there)."""
    values = {
        "sha256": entry.sha256,
        "size": entry.size,
        "mime_type": entry.mime_type,
        "width": entry.width,
        "height": entry.height,
        "is_dir": False,
        "updated_at": func.now(),
    }
    await session.execute(
        insert(tables.File)
        .values(thread_id=thread_id, path=entry.path, **values)
        .on_conflict_do_update(index_elements=["thread_id", "path"], set_=values)
    )
    return entry


async def link(session: AsyncSession, thread_id: uuid.UUID, path: str, source: Entry) -> Entry:
    """A new file at `path` with `source`'s content: the same blob, no bytes copied (copies between threads)."""
    path = normalise(path)
    if source.is_dir or source.sha256 is None:
        raise errors.FileConflict(f"{source.path} is a directory.", path=source.path)
    parent = posixpath.dirname(path)
    if parent != "/":
        await mkdir(session, thread_id, parent)
    existing = await _get(session, thread_id, path, lock=True)
    if existing is not None and existing.is_dir:
        raise errors.FileConflict(f"{path} is a directory.", path=path)
    await blobs.touch(session, source.sha256)
    return await _put(
        session,
        thread_id,
        Entry(path, False, source.size, source.mime_type, source.sha256, source.width, source.height),
    )


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


GREP_MAX_FILE = 5 * 1024 * 1024  # larger files are not searched
GREP_MAX_BYTES = 64 * 1024 * 1024  # a search reads at most this much, files in path order
SEARCH_SECONDS = 10.0  # a search taking longer is refused (`SearchTimeout`)
MAX_RESULTS = 1000
SEARCHERS = 2  # searches matching at once in this process (more wait): their own threads, not the loop's default

_searchers = ThreadPoolExecutor(SEARCHERS, thread_name_prefix="search")


async def _searching(match: Callable[..., T], *args: Any) -> T:
    """`match(*args)` on a search thread."""
    return await asyncio.get_running_loop().run_in_executor(_searchers, match, *args)


@dataclass(frozen=True)
class Match:
    path: str
    line: int  # 1-based
    text: str


async def grep(session: AsyncSession, thread_id: uuid.UUID, pattern: str) -> list[Match]:
    """Lines of the thread's text files that match the RE2 regular expression `pattern` (at most `MAX_RESULTS`),
    from files of up to `GREP_MAX_FILE` bytes, `GREP_MAX_BYTES` in all, in path order."""
    regex = patterns.regex(pattern)
    deadline = time.monotonic() + SEARCH_SECONDS
    rows = await session.execute(
        select(tables.File.path, tables.File.sha256, tables.File.size)
        .where(tables.File.thread_id == thread_id, ~tables.File.is_dir, tables.File.size <= GREP_MAX_FILE)
        .order_by(tables.File.path)
    )
    found: list[Match] = []
    budget = GREP_MAX_BYTES
    for path, sha, size in rows.all():
        assert sha is not None  # files (not directories) always point at a blob
        budget -= size
        if budget < 0:
            break
        data = b"".join([piece async for piece in blobs.chunks(session, sha)])
        lines = await _searching(patterns.lines, regex, data, deadline, MAX_RESULTS - len(found))
        found += [Match(path, number, text) for number, text in lines]
        if len(found) >= MAX_RESULTS:
            break
    return found


async def find(session: AsyncSession, thread_id: uuid.UUID, pattern: str) -> list[Entry]:
    """Entries whose path matches the glob `pattern`, by path (at most `MAX_RESULTS`)."""
    regex = patterns.glob(pattern)
    deadline = time.monotonic() + SEARCH_SECONDS
    rows = await session.execute(
        select(tables.File).where(tables.File.thread_id == thread_id).order_by(tables.File.path)
    )
    entries = [Entry.of(r) for r in rows.scalars()]
    matched = set(await _searching(patterns.fullmatches, regex, [e.path for e in entries], deadline))
    return [e for e in entries if e.path in matched][:MAX_RESULTS]


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
