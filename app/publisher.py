"""Live-only events (streamed deltas) sent as NOTIFYs on the events channel, outside any transaction; the hub
(`hub.py`) of every API process hears them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any

import asyncpg

from app import db, events

log = logging.getLogger(__name__)

CHANNEL = events.CHANNEL
PIECE = 1000  # characters per NOTIFY: even fully escaped, a piece stays under the 8000-byte limit
NOTIFY_BYTES = 8000 - 1  # a NOTIFY payload's limit (less one: the terminating zero)


def _pieces(text: str, size: int) -> list[str]:
    """`text` in consecutive pieces of at most `size` characters whose event stays under a NOTIFY's limit once
    encoded (JSON escapes a character into as many as 12 bytes), so no piece is refused."""
    pieces: list[str] = []
    for start in range(0, len(text), size):
        piece = text[start : start + size]
        if len(json.dumps(piece).encode()) > NOTIFY_BYTES - 400:  # room for the event's other fields
            pieces += _pieces(piece, max(1, size // 2))
        else:
            pieces.append(piece)
    return pieces or [text]


def _packed(items: list[str]) -> list[str]:
    """Encoded deltas (JSON arrays, ASCII) packed in order into JSON lists that each fit in a notification."""
    payloads: list[str] = []
    group: list[str] = []
    size = 1
    for item in items:
        if group and size + len(item) + 1 > NOTIFY_BYTES:
            payloads.append("[" + ",".join(group) + "]")
            group, size = [], 1
        group.append(item)
        size += len(item) + 1
    if group:
        payloads.append("[" + ",".join(group) + "]")
    return payloads


class Publisher:
    """Sends live-only events (streamed deltas) on its own connection, outside any transaction.

    `publish` queues and returns: a sender task sends what is queued in order, everything queued while a send was
    under way in one statement, packed into as few notifications as fit (`[[thread_id, type, data], ...]`): the hub
    hears one notification for many deltas, and hands a thread's deltas of one notification to its streams as one
    delivery, written to each in one send. A caller never waits behind the others' round trips (with one send per
    delta under a lock, fifty streaming calls queued ~190 ms per delta under load); `sent` waits for what it queued,
    so a message's deltas go out before the transaction that stores it commits — or that transaction sends a thread's
    last deltas itself (`take`), a round trip fewer. Deltas are a courtesy (the stored message carries the text), so a
    batch the database refuses is dropped, and so is a delta that finds `LIMIT` queued."""

    LIMIT = 10_000

    def __init__(self, dsn: str, *, pooled: bool = False) -> None:
        self._dsn = dsn
        self._pooled = pooled  # `dsn` is a pooler in transaction mode: each send is one statement, so it may be
        self._conn: asyncpg.Connection | None = None
        self._queued: list[tuple[int, str, str]] = []  # (its number, thread id, the encoded delta), in order
        self._sending_now: set[str] = set()  # the threads of the batch being sent
        self._sending_first: int | None = None  # the number of that batch's first delta
        self._taking: set[str] = set()  # threads whose deltas `take` waits for: left queued for it
        self._batch_sent = asyncio.Event()  # set as each batch is done
        self._sender: asyncio.Task[None] | None = None
        self._full = False  # warned about a full queue, until it drains
        self._numbered = 0  # deltas numbered so far (queued)
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []  # `sent` callers: the last number each waits for
        self._closed = False

    def publish(self, thread_id: uuid.UUID, type_: str, data: dict[str, Any]) -> None:
        """Queue a live event for sending; text longer than a NOTIFY allows is split into consecutive chunks."""
        if self._closed:
            return
        if len(self._queued) >= self.LIMIT:
            if not self._full:
                log.warning("live events dropped: %d queued; the stored messages carry the text", self.LIMIT)
                self._full = True
            return
        chunk = str(data.get("chunk", ""))
        offset = int(data.get("offset", 0))
        tid = str(thread_id)
        for piece in _pieces(chunk, PIECE):
            self._numbered += 1
            self._queued.append(
                (self._numbered, tid, json.dumps([tid, type_, {**data, "chunk": piece, "offset": offset}]))
            )
            offset += len(piece)
        self._sending()

    def _sending(self) -> None:
        if self._queued and not self._closed and (self._sender is None or self._sender.done()):
            self._sender = asyncio.get_running_loop().create_task(self._send())

    def _outstanding(self) -> int | None:
        """The number of the oldest delta neither sent, dropped nor taken (queued, or in the batch being sent)."""
        firsts = [n for n in (self._queued[0][0] if self._queued else None, self._sending_first) if n is not None]
        return min(firsts) if firsts else None

    async def sent(self) -> None:
        """Wait until every event queued so far has been sent, dropped or taken (`take`): those of a batch under way
        included, whoever took later ones."""
        oldest = self._outstanding()
        if oldest is not None and oldest <= self._numbered and not self._closed:  # closed: the rest is dropped
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append((self._numbered, done))
            self._sending()  # a sender cut off (cancelled) leaves its queue to the next one
            await done

    async def take(self, thread_id: uuid.UUID) -> list[str]:
        """The thread's deltas not sent yet, taken out of the queue and packed as notification payloads, for a
        statement that sends them itself (`events.notify_first`): after what a send under way holds of them (waited
        for here, the sender leaving the rest of them queued meanwhile), and before anything the thread publishes
        later. Taken, they are done for `sent`."""
        tid = str(thread_id)
        self._taking.add(tid)
        try:
            while tid in self._sending_now:  # a batch being sent holds some of them: those go first
                self._batch_sent.clear()
                await self._batch_sent.wait()
        except BaseException:
            self._taking.discard(tid)
            self._sending()  # cut off while waiting: what it left queued is sent as usual
            raise
        self._taking.discard(tid)
        mine = [item for _, owner, item in self._queued if owner == tid]
        if not mine:
            return []
        self._queued = [queued for queued in self._queued if queued[1] != tid]
        self._wake()
        return _packed(mine)

    async def _send(self) -> None:
        while self._queued:
            queued = [q for q in self._queued if q[1] not in self._taking]
            if not queued:  # all of it waits for `take`
                break
            self._queued = [q for q in self._queued if q[1] in self._taking]
            batch = [item for _, _, item in queued]
            self._sending_now, self._sending_first = {owner for _, owner, _ in queued}, queued[0][0]
            self._full = False
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await db.connect(self._dsn, connect_timeout=5, pooled=self._pooled)
                # NOTIFY: in order, one round trip for the batch
                sql = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p"
                await self._conn.execute(sql, CHANNEL, _packed(batch))
            except Exception as exc:  # unreachable, refused, or anything else: never the streaming call's failure
                log.warning(
                    "%d live events not sent (%s); the stored messages carry the text", len(batch), type(exc).__name__
                )
                if not isinstance(exc, asyncpg.PostgresError) and self._conn is not None:  # the connection's end
                    conn, self._conn = self._conn, None
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
            finally:  # sent, dropped, or cut off (a cancelled sender): nobody waits for these any longer
                self._sending_now, self._sending_first = set(), None
                self._batch_sent.set()
                self._wake()

    def _wake(self) -> None:
        oldest = self._outstanding()
        still = []
        for target, done in self._waiting:
            if oldest is not None and oldest <= target:
                still.append((target, done))
            elif not done.done():
                done.set_result(None)
        self._waiting = still

    async def close(self) -> None:
        """Send what is queued, then close the connection; later events are dropped."""
        self._closed = True
        if self._sender is not None:
            await self._sender
            self._sender = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
