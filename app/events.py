"""The per-thread event log, and live fan-out over LISTEN/NOTIFY to SSE subscribers.

An event is written in the transaction of the change it reports; its `seq` comes from
`threads.event_seq` under the thread row lock, so seq order is commit order. The NOTIFY issued in the same
transaction is delivered at commit. Streaming deltas (`message_chunk`) are never stored: they travel as NOTIFY
payloads only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app import tables

log = logging.getLogger(__name__)

CHANNEL = "agents_events"
PIECE = 1000  # characters per NOTIFY: even fully escaped, a piece stays under the 8000-byte limit


async def append(session: AsyncSession, thread_id: uuid.UUID, type_: str, data: Mapping[str, Any]) -> int:
    """Store one event of a thread and announce it at commit; returns its seq."""
    seq: int = (
        await session.execute(
            text("UPDATE threads SET event_seq = event_seq + 1 WHERE id = :id RETURNING event_seq"),
            {"id": thread_id},
        )
    ).scalar_one()
    session.add(tables.Event(thread_id=thread_id, seq=seq, type=type_, data=dict(data)))
    await session.execute(select(func.pg_notify(CHANNEL, f"{thread_id}:{seq}")))
    return seq


async def read(session: AsyncSession, thread_id: uuid.UUID, after: int, limit: int = 500) -> list[tables.Event]:
    """Stored events of a thread with seq greater than `after`, in order."""
    query = (
        select(tables.Event)
        .where(tables.Event.thread_id == thread_id, tables.Event.seq > after)
        .order_by(tables.Event.seq)
        .limit(limit)
    )
    return list((await session.execute(query)).scalars())


async def missed(session: AsyncSession, thread_id: uuid.UUID, after: int) -> int | None:
    """When retention removed events after `after`, the oldest seq still stored (the `events_missed` answer)."""
    row = (
        await session.execute(
            text(
                "SELECT t.event_seq, (SELECT min(seq) FROM events e WHERE e.thread_id = t.id) AS oldest "
                "FROM threads t WHERE t.id = :id"
            ),
            {"id": thread_id},
        )
    ).one()
    if after >= row.event_seq:
        return None
    oldest = row.oldest if row.oldest is not None else row.event_seq + 1
    return int(oldest) if oldest > after + 1 else None


# -- the lifecycle stream ------------------------------------------------------------------------------------

LIFECYCLE = uuid.UUID(int=0)  # the hub key of lifecycle subscribers


async def append_lifecycle(session: AsyncSession, thread: tables.Thread, type_: str) -> int:
    """Record `thread_created` / `thread_updated` / `thread_deleted` for the thread's owner; returns its seq.

    The seq comes from the `lifecycle` counter row under its lock, so seq order is commit order (low volume).
    """
    seq: int = (
        await session.execute(text("UPDATE counters SET value = value + 1 WHERE name = 'lifecycle' RETURNING value"))
    ).scalar_one()
    data = {"thread_id": str(thread.id), "agent": thread.agent, "status": thread.status, "name": thread.name}
    session.add(tables.LifecycleEvent(seq=seq, user_id=thread.user_id, thread_id=thread.id, type=type_, data=data))
    await session.execute(select(func.pg_notify(CHANNEL, f"{LIFECYCLE}:{seq}")))
    return seq


async def read_lifecycle(
    session: AsyncSession, user_id: str | None, after: int, limit: int = 500
) -> list[tables.LifecycleEvent]:
    """Lifecycle events after `after`, of one user's threads (all threads when `user_id` is None)."""
    query = select(tables.LifecycleEvent).where(tables.LifecycleEvent.seq > after)
    if user_id is not None:
        query = query.where(tables.LifecycleEvent.user_id == user_id)
    return list((await session.execute(query.order_by(tables.LifecycleEvent.seq).limit(limit))).scalars())


async def missed_lifecycle(session: AsyncSession, after: int) -> int | None:
    """When retention removed lifecycle events after `after`, the oldest seq still stored."""
    row = (
        await session.execute(
            text(
                "SELECT c.value AS last, (SELECT min(seq) FROM lifecycle_events) AS oldest "
                "FROM counters c WHERE c.name = 'lifecycle'"
            )
        )
    ).one()
    if after >= row.last:
        return None
    oldest = row.oldest if row.oldest is not None else row.last + 1
    return int(oldest) if oldest > after + 1 else None


# EXPIRE: retention, in batches so a large backlog never holds one long transaction.
_EXPIRE = text(
    """
    DELETE FROM events WHERE ctid IN (
        SELECT ctid FROM events WHERE created_at < now() - make_interval(secs => :age) LIMIT :batch
    )
    """
)


_EXPIRE_LIFECYCLE = text(
    """
    DELETE FROM lifecycle_events WHERE seq IN (
        SELECT seq FROM lifecycle_events WHERE created_at < now() - make_interval(secs => :age) LIMIT :batch
    )
    """
)


async def expire(session: AsyncSession, age_seconds: float, batch: int = 10_000) -> int:
    """Delete one batch of thread and lifecycle events older than `age_seconds`; returns how many went."""
    gone = 0
    for statement in (_EXPIRE, _EXPIRE_LIFECYCLE):
        result = await session.execute(statement, {"age": age_seconds, "batch": batch})
        gone += int(result.rowcount)  # type: ignore[attr-defined]
    return gone


@dataclass(frozen=True)
class Stored:
    """A stored event committed: read it from the log."""

    seq: int


@dataclass(frozen=True)
class Live:
    """A live-only event (a streamed delta) with its payload."""

    type: str
    data: dict[str, Any]


class Overflow(Exception):
    """The subscriber fell behind and was cut off; it resumes with `Last-Event-ID`."""


class Subscription:
    """One SSE client's bounded buffer of notifications."""

    def __init__(self, thread_id: uuid.UUID, size: int) -> None:
        self.thread_id = thread_id
        self.queue: asyncio.Queue[Stored | Live] = asyncio.Queue(maxsize=size)
        self.overflowed = False

    def push(self, item: Stored | Live) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed = True

    async def get(self) -> Stored | Live:
        """The next notification; `Overflow` once the buffer ran over."""
        if self.overflowed:
            raise Overflow()
        item = await self.queue.get()
        if self.overflowed:
            raise Overflow()
        return item


class Hub:
    """Holds one LISTEN connection per process and dispatches notifications to subscribers in memory."""

    def __init__(self, dsn: str, buffer: int = 1000) -> None:
        self._dsn = dsn
        self._buffer = buffer
        self._conn: asyncpg.Connection | None = None
        self._subs: dict[uuid.UUID, set[Subscription]] = {}

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self._dsn)
        await self._conn.add_listener(CHANNEL, self._on_notify)

    async def stop(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    def subscribe(self, thread_id: uuid.UUID) -> Subscription:
        sub = Subscription(thread_id, self._buffer)
        self._subs.setdefault(thread_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.thread_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.thread_id]

    @property
    def subscribers(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        assert isinstance(payload, str)
        try:
            if payload.startswith("{"):
                body = json.loads(payload)
                thread_id = uuid.UUID(body["thread_id"])
                item: Stored | Live = Live(body["type"], body["data"])
            else:
                tid, seq = payload.split(":")
                thread_id, item = uuid.UUID(tid), Stored(int(seq))
        except (ValueError, KeyError):
            log.warning("ignoring malformed event notification %r", payload[:100])
            return
        for sub in list(self._subs.get(thread_id, ())):
            sub.push(item)


class Publisher:
    """Sends live-only events (streamed deltas) on its own connection, outside any transaction."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()

    async def publish(self, thread_id: uuid.UUID, type_: str, data: dict[str, Any]) -> None:
        """Send a live event; text longer than a NOTIFY allows is split into consecutive chunks."""
        chunk = str(data.get("chunk", ""))
        offset = int(data.get("offset", 0))
        pieces = [chunk[i : i + PIECE] for i in range(0, len(chunk), PIECE)] or [chunk]
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self._dsn)
            for piece in pieces:
                body = {
                    "thread_id": str(thread_id),
                    "type": type_,
                    "data": {**data, "chunk": piece, "offset": offset},
                }
                await self._conn.execute("SELECT pg_notify($1, $2)", CHANNEL, json.dumps(body))
                offset += len(piece)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
