"""Content-addressed file content in Postgres: a blob is stored once per SHA-256, in chunks of about 1 MB.

Writing spools the incoming bytes (memory up to one chunk, then a temporary file) while hashing them and counting
against the size limit, so an over-large body is refused while it streams in and nothing is stored; identical
content is stored once. Reading yields one chunk at a time. A blob no file points at is collected after a grace
period, so a copy in flight (which points a new entry at an existing blob) never loses it.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import errors, tables

CHUNK = 1024 * 1024
HEAD = 256 * 1024


@dataclass(frozen=True)
class Stored:
    sha256: str
    size: int
    head: bytes = b""  # the first bytes (up to `HEAD`), for sniffing image dimensions


_PUT = text(
    """
    INSERT INTO blobs (sha256, size) VALUES (:sha, :size)
    ON CONFLICT (sha256) DO UPDATE SET created_at = now()
    RETURNING (xmax = 0) AS inserted
    """
)


async def put(session: AsyncSession, body: AsyncIterable[bytes], limit: int) -> Stored:
    """Store `body` (once per content); `TooLarge` as soon as it passes `limit` bytes."""
    digest = hashlib.sha256()
    size = 0
    with tempfile.SpooledTemporaryFile(max_size=CHUNK) as spool:
        async for piece in body:
            size += len(piece)
            if size > limit:
                raise errors.TooLarge(f"The content exceeds the limit of {limit} bytes.", limit=limit)
            digest.update(piece)
            spool.write(piece)
        sha = digest.hexdigest()
        spool.seek(0)
        head = spool.read(HEAD)
        # an existing blob is touched: its grace period restarts and the row lock keeps `collect` off it
        inserted = (await session.execute(_PUT, {"sha": sha, "size": size})).scalar_one()
        if inserted:  # new content: its chunks, read back from the spool
            spool.seek(0)
            index = 0
            while piece := spool.read(CHUNK):
                session.add(tables.BlobChunk(sha256=sha, index=index, data=piece))
                index += 1
            await session.flush()
    return Stored(sha, size, head)


_TOUCH = text("UPDATE blobs SET created_at = now() WHERE sha256 = :sha")


async def touch(session: AsyncSession, sha256: str) -> None:
    """Restart a blob's grace period and lock it until commit, so `collect` cannot take it from a new reference."""
    await session.execute(_TOUCH, {"sha": sha256})


_CHUNK = text("SELECT data FROM blob_chunks WHERE sha256 = :sha AND index = :index")


async def chunk(session: AsyncSession, sha256: str, index: int) -> bytes | None:
    """The blob's `index`-th chunk, or None past its end."""
    piece: bytes | None = (await session.execute(_CHUNK, {"sha": sha256, "index": index})).scalar_one_or_none()
    return piece


async def chunks(session: AsyncSession, sha256: str) -> AsyncIterator[bytes]:
    """The blob's bytes, one chunk at a time, on the caller's session."""
    index = 0
    while (piece := await chunk(session, sha256, index)) is not None:
        yield piece
        index += 1


async def stream(sessions: async_sessionmaker[AsyncSession], sha256: str) -> AsyncIterator[bytes]:
    """The blob's bytes for a download: each chunk on a short session, so a slow client holds no connection."""
    index = 0
    while True:
        async with sessions() as session:
            piece = await chunk(session, sha256, index)
        if piece is None:
            return
        yield piece
        index += 1


# COLLECT: blobs no file points at, older than the grace period (a copy in flight points at a blob it just checked).
_COLLECT = text(
    """
    DELETE FROM blobs b
    WHERE b.created_at < now() - make_interval(secs => :grace)
      AND NOT EXISTS (SELECT 1 FROM files f WHERE f.sha256 = b.sha256)
    """
)


async def collect(session: AsyncSession, grace_seconds: float) -> int:
    """Delete unreferenced blobs older than `grace_seconds` (their chunks go with them); returns how many."""
    result = await session.execute(_COLLECT, {"grace": grace_seconds})
    return int(result.rowcount)  # type: ignore[attr-defined]
