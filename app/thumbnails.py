"""Image thumbnails (§9): made once per content and size, and stored under the source blob's SHA-256.

Decoding is CPU and memory work: it runs on a pool of `WORKERS` threads, so at most that many images (each of at
most `images.MAX_PIXELS`) are decoded at once and never on the event loop. A request reads its image only once it
has a slot, and at most `MAX_WAITING` wait for one (each holds its request's database connection): beyond, `Busy`
(503). A request for a content being made (or just made) waits for that one instead of making it again; later ones
read the stored row, which goes with its blob.
"""

from __future__ import annotations

import asyncio
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app import blobs, errors, files, images, tables

WORKERS = 2  # images decoded at once in this process
MAX_WAITING = 8  # requests waiting for a slot, each holding a database connection
KEEP_SECONDS = 5.0  # a thumbnail just made is answered from memory meanwhile its maker commits it

_pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="thumbnails")
_making: dict[tuple[str, int], asyncio.Future[bytes]] = {}  # what this process is making, or just made


@dataclass
class _Slots:
    """One event loop's decoding slots (an asyncio semaphore belongs to one loop)."""

    free: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(WORKERS))
    waiting: int = 0


_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slots] = weakref.WeakKeyDictionary()


class _Abandoned(Exception):
    """The request making a thumbnail stopped before it was made (cancelled, or its database failed)."""


async def get(session: AsyncSession, entry: files.Entry, size: int = images.THUMBNAIL) -> bytes:
    """The JPEG thumbnail of the image file `entry`, stored on `session` when made; `NotAnImage`, or its subclass
    `ImageTooLarge`, if there cannot be one."""
    if entry.is_dir or entry.sha256 is None or not images.is_image(entry.mime_type):
        raise errors.NotAnImage(f"{entry.path} is not an image a thumbnail can be made of.", path=entry.path)
    try:
        return await _shared(session, entry.sha256, size)
    except errors.ImageTooLarge:
        raise
    except errors.NotAnImage:
        raise errors.NotAnImage(f"{entry.path} is not an image a thumbnail can be made of.", path=entry.path) from None


async def _shared(session: AsyncSession, sha256: str, size: int) -> bytes:
    """The stored thumbnail, the one being made, or one made now (and its answer shared with those who wait)."""
    key = (sha256, size)
    while True:
        query = select(tables.Thumbnail.data).where(tables.Thumbnail.sha256 == sha256, tables.Thumbnail.size == size)
        stored: bytes | None = (await session.execute(query)).scalar_one_or_none()
        if stored is not None:
            return stored
        making = _making.get(key)
        if making is None:
            break
        try:
            return await asyncio.shield(making)  # a waiter cancelled does not cancel the one making it
        except _Abandoned:
            continue  # made by no one: look again, and make it
    loop = asyncio.get_running_loop()
    making = _making[key] = loop.create_future()
    try:
        thumb = await _make(session, sha256, size)
        making.set_result(thumb)
        return thumb
    except errors.Busy:  # no answer for this content: those waiting look again
        making.set_exception(_Abandoned())
        del _making[key]
        raise
    except errors.AgentsError as exc:  # the answer for this content: the same for everyone waiting
        making.set_exception(exc)
        raise
    except BaseException:
        making.set_exception(_Abandoned())
        del _making[key]
        raise
    finally:
        making.exception()  # retrieved: with no one waiting, asyncio would log it as never retrieved
        if _making.get(key) is making:  # the answer stays a while: the row is not committed yet
            loop.call_later(KEEP_SECONDS, _forget, key, making)


def _forget(key: tuple[str, int], making: asyncio.Future[bytes]) -> None:
    if _making.get(key) is making:
        del _making[key]


async def _make(session: AsyncSession, sha256: str, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    slots = _slots.setdefault(loop, _Slots())
    if slots.free.locked() and slots.waiting >= MAX_WAITING:
        raise errors.Busy("Too many thumbnails are being made right now; try again shortly.")
    slots.waiting += 1
    try:
        await slots.free.acquire()
    finally:
        slots.waiting -= 1
    try:
        data = b"".join([piece async for piece in blobs.chunks(session, sha256)])
        decoding = _pool.submit(images.thumbnail, data, size)
    except BaseException:
        slots.free.release()
        raise
    # the slot is free when the decode ends, not when a cancelled request stops waiting for it
    decoding.add_done_callback(lambda _: loop.call_soon_threadsafe(slots.free.release))
    thumb = await asyncio.wrap_future(decoding)
    await session.execute(
        insert(tables.Thumbnail).values(sha256=sha256, size=size, data=thumb).on_conflict_do_nothing()
    )
    return thumb
