"""The file methods of `ThreadState` (§9), over the thread's file tree (`app.files`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from app import blobs, errors, files, thumbnails
from app.engine import types
from app.spec.state import FileRecord, FileStats, FindResult, GrepMatch, ReaddirResult


class Files:
    """A thread's files as a `RunState` offers them (it delegates its file methods here): every call is one short
    transaction on the thread, fenced inside an execution."""

    def __init__(self, transaction: types.Transaction) -> None:
        self._transaction = transaction

    async def write_file(self, path: str, data: bytes | str, mime_type: str | None = None) -> FileRecord:
        if not isinstance(data, bytes | str):
            raise errors.Invalid("`state.write_file` takes bytes or a string")
        raw = data.encode() if isinstance(data, str) else data
        async with self._transaction() as (session, thread):
            return _file(await files.write_bytes(session, thread.id, path, raw, mime_type))

    async def read_file(self, path: str) -> bytes | None:
        async with self._transaction() as (session, thread):
            try:
                return await files.read_bytes(session, thread.id, path)
            except (errors.FileNotFound, errors.FileConflict):
                return None

    async def read_file_stream(self, path: str) -> AsyncIterator[bytes] | None:
        record = await self.stat_file(path)
        if record is None or record.sha256 is None:
            return None
        return self._chunks(record.sha256)

    async def _chunks(self, sha256: str) -> AsyncIterator[bytes]:
        index = 0
        while True:  # one short transaction per chunk: no connection is held while the caller works
            async with self._transaction() as (session, _):
                piece = await blobs.chunk(session, sha256, index)
            if piece is None:
                return
            yield piece
            index += 1

    async def stat_file(self, path: str) -> FileRecord | None:
        async with self._transaction() as (session, thread):
            try:
                return _file(await files.stat(session, thread.id, path))
            except errors.FileNotFound:
                return None

    async def readdir_file(self, path: str = "/") -> ReaddirResult:
        async with self._transaction() as (session, thread):
            entries = await files.readdir(session, thread.id, path)
        return ReaddirResult(path=files.normalise(path), entries=[_file(e) for e in entries])

    async def unlink_file(self, path: str) -> None:
        async with self._transaction() as (session, thread):
            await files.unlink(session, thread.id, path)

    async def mkdir_file(self, path: str) -> FileRecord:
        async with self._transaction() as (session, thread):
            return _file(await files.mkdir(session, thread.id, path))

    async def rmdir_file(self, path: str) -> None:
        async with self._transaction() as (session, thread):
            await files.rmdir(session, thread.id, path)

    async def get_file_stats(self) -> FileStats:
        async with self._transaction() as (session, thread):
            usage = await files.usage(session, thread.id)
        return FileStats(files=usage.files, directories=usage.directories, bytes=usage.bytes)

    async def grep_files(self, pattern: str) -> list[GrepMatch]:
        async with self._transaction() as (session, thread):
            found = await files.grep(session, thread.id, pattern)
        return [GrepMatch(path=m.path, line=m.line, text=m.text) for m in found]

    async def find_files(self, pattern: str) -> FindResult:
        async with self._transaction() as (session, thread):
            found = await files.find(session, thread.id, pattern)
        return FindResult(pattern=pattern, entries=[_file(e) for e in found])

    async def get_file_thumbnail(self, path: str) -> bytes | None:
        async with self._transaction() as (session, thread):
            try:
                return await thumbnails.get(session, await files.stat(session, thread.id, path))
            except (errors.FileNotFound, errors.NotAnImage):
                return None


def _file(entry: files.Entry) -> FileRecord:
    return FileRecord.model_validate(entry.record())
