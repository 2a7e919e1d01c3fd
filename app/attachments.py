"""Attachments (§9): files under `/attachments/` referenced from messages, and copies of them between threads.

A reference is `{path, name, mime_type, size, width?, height?}`. Names are sanitised (`[^A-Za-z0-9._-]` → `-`)
and made unique with 8 random hex digits, so two uploads of `photo.png` never replace each other.
"""

from __future__ import annotations

import base64
import binascii
import logging
import mimetypes
import posixpath
import re
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app import errors, files
from app.spec.results import ToolAttachment

log = logging.getLogger(__name__)

FOLDER = "/attachments"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_STEM = 64
MAX_EXT = 16


def path_for(name: str) -> str:
    """`/attachments/<stem ≤ 64>-<8 hex>.<ext>` for a file called `name`."""
    base = posixpath.basename(str(name).replace("\\", "/")) or "file"
    stem, dot, ext = base.rpartition(".")
    if not dot or not stem:
        stem, ext = base, ""
    stem = _UNSAFE.sub("-", stem).strip(".-")[:MAX_STEM] or "file"
    ext = _UNSAFE.sub("-", ext)[:MAX_EXT]
    suffix = f".{ext}" if ext else ""
    return f"{FOLDER}/{stem}-{uuid.uuid4().hex[:8]}{suffix}"


def reference(entry: files.Entry, name: str | None = None) -> dict[str, Any]:
    """How a message refers to a stored file."""
    ref: dict[str, Any] = {
        "path": entry.path,
        "name": name or entry.name,
        "mime_type": entry.mime_type or "application/octet-stream",
        "size": entry.size,
    }
    if entry.width is not None and entry.height is not None:
        ref["width"], ref["height"] = entry.width, entry.height
    return ref


def decode(data: str, name: str) -> bytes:
    """The bytes of base64 `data` (a `data:` URL prefix is allowed); `Invalid` naming the attachment otherwise."""
    if data.startswith("data:") and "," in data:
        data = data.split(",", 1)[1]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise errors.Invalid(f"Attachment `{name}`: `data` is not valid base64.", name=name) from exc


async def store(
    session: AsyncSession,
    thread_id: uuid.UUID,
    name: str,
    body: bytes | AsyncIterable[bytes],
    mime_type: str | None,
    limit: int,
) -> dict[str, Any]:
    """Store an uploaded attachment in the thread's `/attachments/` and return its reference."""
    if isinstance(body, bytes):
        if len(body) > limit:
            raise errors.TooLarge(f"Attachment `{name}` exceeds the limit of {limit} bytes.", limit=limit)
        body = _once(body)
    mime = (mime_type or "").strip() or mimetypes.guess_type(name)[0] or "application/octet-stream"
    entry = await files.write(session, thread_id, path_for(name), body, mime, limit=limit)
    return reference(entry, name)


class Encoded(Protocol):
    """A new attachment in a request body: its name, base64 `data` and type."""

    @property
    def name(self) -> str: ...
    @property
    def data(self) -> str: ...
    @property
    def mime_type(self) -> str | None: ...


async def store_encoded(
    session: AsyncSession, thread_id: uuid.UUID, items: Iterable[Encoded], limit: int
) -> list[dict[str, Any]]:
    """Store a request's base64 attachments under `/attachments/` (each at most `limit` bytes); their references."""
    return [await store(session, thread_id, a.name, decode(a.data, a.name), a.mime_type, limit) for a in items]


async def returned(session: AsyncSession, thread_id: uuid.UUID, items: list[ToolAttachment]) -> list[dict[str, Any]]:
    """Store the files a tool returned under `/attachments/` and return their references; one that is not valid
    base64 is left out (and logged). A tool's own output is not held to the upload size limit."""
    refs: list[dict[str, Any]] = []
    for item in items:
        try:
            data = decode(item.data, item.name)
        except errors.Invalid:
            log.warning("tool result attachment %r is not valid base64; left out", item.name)
            continue
        refs.append(await store(session, thread_id, item.name, data, item.mime_type, len(data)))
    return refs


async def copy(
    session: AsyncSession, source_thread: uuid.UUID, path: str, destination_thread: uuid.UUID
) -> dict[str, Any]:
    """Copy a file to another thread's `/attachments/` pointing at the same blob (no bytes copied); return the
    destination-local reference. `FileNotFound` names a path the source does not have."""
    try:
        entry = await files.stat(session, source_thread, path)
    except errors.FileNotFound:
        raise errors.FileNotFound(f"Attachment not found: {path}", path=path) from None
    copied = await files.link(session, destination_thread, path_for(entry.name), entry)
    return reference(copied, entry.name)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
