"""A thread's files: upload (the raw body), download, list, search (`grep`, `find`), usage and delete."""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterable, Iterable
from typing import IO

from agents_client import call, models
from agents_client.call import Call, ThreadRef

Content = bytes | str | IO[bytes] | Iterable[bytes]
AsyncContent = bytes | str | AsyncIterable[bytes]  # an async httpx client sends no sync stream


def _path(thread: ThreadRef, path: str) -> str:
    """`/threads/<id>/fs/<path>`, the file path percent-encoded segment by segment."""
    inner = urllib.parse.quote(path.strip("/"), safe="/")
    return call.thread_path(thread, "fs", inner) if inner else call.thread_path(thread, "fs")


def _upload(
    thread: ThreadRef, path: str, content: Content | AsyncContent, mime_type: str | None
) -> Call[models.FileRecord]:
    data = content.encode() if isinstance(content, str) else content
    headers = {"Content-Type": mime_type or "application/octet-stream"}
    return Call("PUT", _path(thread, path), call.model(models.FileRecord), content=data, headers=headers)


def _download(thread: ThreadRef, path: str, thumbnail: bool) -> Call[bytes]:
    params = call.query(thumbnail=thumbnail or None)
    return Call("GET", _path(thread, path), call.body, params=params)


def _list(thread: ThreadRef, path: str) -> Call[models.FileList]:
    return Call("GET", _path(thread, path), call.model(models.FileList))


def _find(thread: ThreadRef, pattern: str) -> Call[models.FileList]:
    return Call("GET", _path(thread, "/"), call.model(models.FileList), params={"find": pattern})


def _grep(thread: ThreadRef, pattern: str) -> Call[models.GrepResult]:
    return Call("GET", _path(thread, "/"), call.model(models.GrepResult), params={"grep": pattern})


def _usage(thread: ThreadRef) -> Call[models.FileUsage]:
    return Call("GET", _path(thread, "/"), call.model(models.FileUsage), params={"stats": "true"})


def _delete(thread: ThreadRef, path: str) -> Call[str]:
    return Call("DELETE", _path(thread, path), lambda response: str(response.json()["deleted"]))


class Files:
    def __init__(self, send: call.Sender) -> None:
        self._send = send

    def upload(self, thread: ThreadRef, path: str, content: Content, mime_type: str | None = None) -> models.FileRecord:
        """Store `content` at `path` (replacing a file there), as `mime_type`."""
        return self._send(_upload(thread, path, content, mime_type))

    def download(self, thread: ThreadRef, path: str, *, thumbnail: bool = False) -> bytes:
        """A file's bytes (`thumbnail`: a JPEG of at most 256 px of an image)."""
        return self._send(_download(thread, path, thumbnail))

    def list(self, thread: ThreadRef, path: str = "/") -> models.FileList:
        """A directory's entries."""
        return self._send(_list(thread, path))

    def find(self, thread: ThreadRef, pattern: str) -> models.FileList:
        """Entries matching a glob (`*.md`, `/reports/**/*.pdf`)."""
        return self._send(_find(thread, pattern))

    def grep(self, thread: ThreadRef, pattern: str) -> models.GrepResult:
        """Lines of the thread's text files that match an RE2 regular expression."""
        return self._send(_grep(thread, pattern))

    def usage(self, thread: ThreadRef) -> models.FileUsage:
        return self._send(_usage(thread))

    def delete(self, thread: ThreadRef, path: str) -> str:
        """Delete a file or an empty directory; its normalised path."""
        return self._send(_delete(thread, path))


class AsyncFiles:
    def __init__(self, send: call.AsyncSender) -> None:
        self._send = send

    async def upload(
        self, thread: ThreadRef, path: str, content: AsyncContent, mime_type: str | None = None
    ) -> models.FileRecord:
        """Store `content` at `path` (replacing a file there), as `mime_type`."""
        return await self._send(_upload(thread, path, content, mime_type))

    async def download(self, thread: ThreadRef, path: str, *, thumbnail: bool = False) -> bytes:
        """A file's bytes (`thumbnail`: a JPEG of at most 256 px of an image)."""
        return await self._send(_download(thread, path, thumbnail))

    async def list(self, thread: ThreadRef, path: str = "/") -> models.FileList:
        """A directory's entries."""
        return await self._send(_list(thread, path))

    async def find(self, thread: ThreadRef, pattern: str) -> models.FileList:
        """Entries matching a glob (`*.md`, `/reports/**/*.pdf`)."""
        return await self._send(_find(thread, pattern))

    async def grep(self, thread: ThreadRef, pattern: str) -> models.GrepResult:
        """Lines of the thread's text files that match an RE2 regular expression."""
        return await self._send(_grep(thread, pattern))

    async def usage(self, thread: ThreadRef) -> models.FileUsage:
        return await self._send(_usage(thread))

    async def delete(self, thread: ThreadRef, path: str) -> str:
        """Delete a file or an empty directory; its normalised path."""
        return await self._send(_delete(thread, path))
