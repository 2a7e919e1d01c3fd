"""Live fan-out: one LISTEN connection per process, notifications dispatched to SSE subscribers in memory.

A committed event is announced as `thread_id:seq`. For a thread (or the lifecycle stream) that has subscribers in
this process, the hub reads the new events **once** and hands the same `Entry` (payload serialised once) to every
subscriber, so a thousand streams on one thread cost one query per event, not a thousand. The batch an engine
transaction writes usually comes with its announcement (`thread_id:seq:[[type, data], ...]`, when it fits in a
payload): then nothing is read at all, unless a read of that thread is under way or a seq was skipped. Streamed deltas
(`message_chunk`) arrive as JSON payloads, several in one (`Publisher` packs what was queued together), a thread's
deltas of one payload handed on as one delivery; a delta that arrives while the events before it are still being read
waits for them, so a subscriber never sees a message's text before the message.

Each subscription keeps its stream's clock (last send, send under way), and one ticker task looks at all of them: a
keepalive is asked of a quiet stream and a stream whose client stopped reading is ended, without a task or timer per
stream (10,000 open streams are a chat widget's scale: bench/streams.py).

A stream opened with an API key is cut off once the key is revoked, whichever process revoked it: the hub hears of
every change to the keys, and checks them again every `KEY_CHECK` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import db, events, keys
from app.publisher import Publisher

__all__ = ["Publisher"]  # where the engine has always imported it from (`app/publisher.py` since it grew)

log = logging.getLogger(__name__)

CHANNEL = events.CHANNEL
WATCH_INTERVAL = 1.0  # seconds between checks that the LISTEN connection is still open
KEY_CHECK = 5.0  # seconds between checks of the keys streams were opened with, changed or not
TICK = 1.0  # seconds between the ticker's looks at every stream's clock (keepalives, send timeouts)


@dataclass
class Entry:
    """A stored event, serialised once for every subscriber; `owner` is the thread's user (lifecycle events).

    `frame` caches the event as the stream sends it (set by the first subscriber that sends it).
    """

    seq: int
    type: str
    data: dict[str, Any]
    text: str
    owner: str | None = None
    frame: bytes | None = field(default=None, compare=False)

    @classmethod
    def of(cls, row: events.Row) -> Entry:
        return cls(row.seq, row.type, row.data, json.dumps(row.data), getattr(row, "user_id", None))


@dataclass(frozen=True)
class Stored:
    """A stored event committed; `entry` is the event itself, or None: read it from the log."""

    seq: int
    entry: Entry | None = None


@dataclass
class Live:
    """A live-only event (a streamed delta) with its payload; `frame` as for `Entry`."""

    type: str
    data: dict[str, Any]
    text: str
    frame: bytes | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Batch:
    """Events the hub read together, in seq order, or deltas that came in one notification: one delivery."""

    items: Sequence[Stored | Live]


class Overflow(Exception):
    """The subscriber fell behind and was cut off; it resumes with `Last-Event-ID`."""


class _Buffer(list["Stored | Live | Batch"]):
    """A subscription's buffer: a list (56 bytes empty, a deque 760: ten thousand idle streams hold one each) taken
    from the front, which stays short (the stream takes all of it at once)."""

    def popleft(self) -> Stored | Live | Batch:
        return self.pop(0)


class Subscription:
    """One SSE client's bounded buffer of notifications; the stream takes what is buffered in one go.

    It also keeps the stream's clock, which the hub's one ticker reads for every subscriber (rather than a ping task
    and a send timer per stream): `ping` asks the stream for a keepalive once `keepalive` seconds passed since its
    last send; a send under way for `send_timeout` seconds cancels `task` (the stream's own), with `timed_out` set.
    """

    __slots__ = (
        "_waiter",
        "api_key",
        "items",
        "keepalive",
        "key",
        "last_send",
        "overflowed",
        "ping",
        "send_timeout",
        "sending_since",
        "size",
        "task",
        "timed_out",
    )  # fmt: skip

    def __init__(
        self,
        key: uuid.UUID,
        size: int,
        api_key: uuid.UUID | None = None,
        *,
        keepalive: float | None = None,
        send_timeout: float | None = None,
    ) -> None:
        self.key = key
        self.api_key = api_key  # the key the stream was opened with (none in open mode)
        self.items = _Buffer()
        self.size = size
        self.overflowed = False
        self._waiter: asyncio.Future[None] | None = None
        self.keepalive = keepalive
        self.send_timeout = send_timeout
        self.task: asyncio.Task[Any] | None = None
        self.last_send = asyncio.get_running_loop().time()
        self.sending_since: float | None = None
        self.ping = False
        self.timed_out = False

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def cut_off(self) -> None:
        """End this stream: the client resumes with `Last-Event-ID` and misses nothing."""
        self.overflowed = True
        self._wake()

    def push(self, item: Stored | Live | Batch) -> None:
        if len(self.items) >= self.size:
            self.overflowed = True
        else:
            self.items.append(item)
        self._wake()

    def push_all(self, items: Sequence[Stored | Live]) -> None:
        """Buffer a batch the hub read, in one slot: the buffer bounds how many deliveries a subscriber lags."""
        if items:
            self.push(Batch(items))

    async def wait(self) -> None:
        """Until something is buffered or a keepalive is due; `Overflow` once the buffer ran over."""
        while not self.items and not self.overflowed and not self.ping:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.overflowed:
            raise Overflow()

    def tick(self, now: float) -> None:
        """The ticker's look at this stream: a send stuck past `send_timeout` ends it, a quiet one is pinged."""
        if self.sending_since is not None:
            stuck = self.send_timeout is not None and now - self.sending_since >= self.send_timeout
            if stuck and self.task is not None and not self.timed_out:
                self.timed_out = True
                self.task.cancel()
        elif self.keepalive is not None and now - self.last_send >= self.keepalive and not self.ping:
            self.ping = True
            self._wake()


@dataclass
class _Tail:
    """What the hub has read of one key's log, what was announced, and deltas held behind pending reads."""

    fetched: int
    wanted: int
    held: deque[tuple[int, Live | Batch]] = field(default_factory=deque)


class Hub:
    """Holds one LISTEN connection per process and dispatches notifications to subscribers in memory."""

    def __init__(self, dsn: str, buffer: int, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._dsn = dsn
        self._buffer = buffer
        self._sessions = sessions
        self._conn: asyncpg.Connection | None = None
        self._subs: dict[uuid.UUID, set[Subscription]] = {}
        self._followed: dict[str, uuid.UUID] = {}  # the keys of `_subs` as notifications spell them (`str(key)`)
        self._tails: dict[uuid.UUID, _Tail] = {}
        self._pending: set[uuid.UUID] = set()  # keys with announced events not read yet
        self._drainer: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._keys_changed = asyncio.Event()
        self._key_checker: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._ending: asyncio.Task[None] | None = None
        self._ended = False  # the process is stopping: every stream is ended, a new one at once
        self.keyless = keys.Keyless()  # open mode's key count, kept while this connection hears of key changes

    async def start(self) -> None:
        await self._listen()
        self._watcher = asyncio.create_task(self._watch(), name="hub-listener")
        self._key_checker = asyncio.create_task(self._end_revoked(), name="hub-keys")
        self._ticker = asyncio.create_task(self._tick(), name="hub-ticker")

    async def _listen(self) -> None:
        conn = await db.connect(self._dsn, connect_timeout=10)
        try:
            await conn.add_listener(CHANNEL, self._on_notify)
            await conn.add_listener(keys.CHANNEL, self._on_keys)
        except BaseException:
            await conn.close()
            raise
        self.keyless.changed()  # whatever changed while nobody listened
        self._conn = conn  # `listening` from here on, not before both channels are

    def _on_keys(self, *_: object) -> None:
        self.keyless.changed()
        self._keys_changed.set()

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def _watch(self) -> None:
        """Open the LISTEN connection again when the database dropped it (a restart). Notifications sent meanwhile
        are lost, so every open stream is cut off: its client resumes with `Last-Event-ID` and misses nothing."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            if self._conn is not None and not self._conn.is_closed():
                continue
            try:
                await self._listen()
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                log.warning("event listener cannot reconnect yet (%s)", type(exc).__name__)
                continue
            log.info("event listener reconnected; %d streams asked to resume", self.subscribers)
            for subs in list(self._subs.values()):
                for sub in list(subs):
                    sub.cut_off()

    async def _tick(self) -> None:
        """Every `TICK` seconds, each stream's clock: one task for all of them."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(TICK)
            now = loop.time()
            for subs in list(self._subs.values()):
                for sub in subs:
                    sub.tick(now)

    def end_streams_on(self, stopping: asyncio.Event) -> None:
        """Once `stopping` is set, end every stream (its client resumes elsewhere with `Last-Event-ID`), and any
        opened later at once: the server's shutdown need not wait for them. The first call's event counts."""
        if self._ending is None:
            self._ending = asyncio.create_task(self._end_all(stopping), name="hub-stopping")

    async def _end_all(self, stopping: asyncio.Event) -> None:
        await stopping.wait()
        self._ended = True
        for subs in list(self._subs.values()):
            for sub in subs:
                sub.cut_off()

    async def _end_revoked(self) -> None:
        """Cut off the streams whose key was revoked, and those opened in open mode once a key exists: when keys
        change, and every `KEY_CHECK` seconds for a change announced before a stream subscribed (while it was being
        opened)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._keys_changed.wait(), KEY_CHECK)
            self._keys_changed.clear()
            subs = [sub for subs in self._subs.values() for sub in subs]
            held = {sub.api_key for sub in subs if sub.api_key is not None}
            keyless = any(sub.api_key is None for sub in subs)
            if not held and not keyless:
                continue
            try:  # shielded: a cancelled check must not cost the pool its connection
                revoked, keyed = await asyncio.shield(self._revoked(held, keyless))
            except Exception as exc:  # the database is unreachable: the next round checks again
                log.warning("cannot check the keys of open streams (%s)", type(exc).__name__)
                continue
            ended = [sub for sub in subs if sub.api_key in revoked or (sub.api_key is None and keyed)]
            for sub in ended:
                sub.cut_off()
            if ended:
                log.info("%d streams ended: their key was revoked, or open mode ended", len(ended))

    async def _revoked(self, held: set[uuid.UUID], keyless: bool) -> tuple[set[uuid.UUID], bool]:
        """Which of `held` are revoked, and (asked when streams of open mode are open) whether any key exists."""
        async with db.autocommit(self._sessions) as session:
            revoked = await keys.revoked(session, held) if held else set()
            return revoked, keyless and await keys.active_count(session) > 0

    async def stop(self) -> None:
        for task in (self._watcher, self._key_checker, self._ticker, self._ending):
            if task is not None:
                task.cancel()
        if self._drainer is not None:
            self._drainer.cancel()
        self._tails.clear()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
            self._conn = None

    def subscribe(
        self,
        key: uuid.UUID,
        api_key: uuid.UUID | None = None,
        *,
        keepalive: float | None = None,
        send_timeout: float | None = None,
    ) -> Subscription:
        """A subscription to `key`'s events; `keepalive` and `send_timeout` (seconds) as `Subscription` says."""
        sub = Subscription(key, self._buffer, api_key, keepalive=keepalive, send_timeout=send_timeout)
        subs = self._subs.get(key)
        if subs is None:
            subs = self._subs[key] = set()
            self._followed[str(key)] = key
        subs.add(sub)
        if self._ended:
            sub.cut_off()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.key]
                self._followed.pop(str(sub.key), None)
                self._tails.pop(sub.key, None)
                self._pending.discard(sub.key)

    @property
    def subscribers(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def _push(self, key: uuid.UUID, item: Stored | Live | Batch) -> None:
        for sub in list(self._subs.get(key, ())):
            sub.push(item)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        assert isinstance(payload, str)
        try:
            if payload.startswith("["):
                self._deltas(json.loads(payload))
            elif payload.startswith("{"):  # one delta, as a `Publisher` before deltas were packed sends it
                body = json.loads(payload)
                key = uuid.UUID(body["thread_id"])
                data = body["data"]
                self._live(key, Live(body["type"], data, json.dumps(data)))
            else:
                tid, seq, *carried = payload.split(":", 2)
                key = uuid.UUID(tid)
                if carried and key in self._subs:  # decoded only where someone follows the thread
                    self._carried(key, int(seq), json.loads(carried[0]))
                elif not carried:
                    self._stored(key, int(seq))
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed event notification %r", payload[:100])

    def _deltas(self, packed: list[list[Any]]) -> None:
        """Deltas packed in one notification (`[[thread_id, type, data], ...]`, in order): each followed thread's
        handed on as one delivery, decoded only where someone follows the thread."""
        found: dict[uuid.UUID, list[Live]] = {}
        followed = self._followed  # a thread's id as `Publisher` writes it: no id parsed, a thread nobody here
        for tid, type_, data in packed:  # follows costs one lookup (every API process hears every delta)
            key = followed.get(tid)
            if key is not None:
                found.setdefault(key, []).append(Live(str(type_), data, json.dumps(data)))
        for key, lives in found.items():
            self._live(key, lives[0] if len(lives) == 1 else Batch(lives))

    def _live(self, key: uuid.UUID, item: Live | Batch) -> None:
        if key not in self._subs:
            return
        tail = self._tails.get(key)
        if tail is not None and tail.fetched < tail.wanted:
            tail.held.append((tail.wanted, item))  # after the events announced before it
        else:
            self._push(key, item)

    def _stored(self, key: uuid.UUID, seq: int) -> None:
        if key not in self._subs:
            return
        tail = self._tails.get(key)
        if tail is None:
            tail = self._tails[key] = _Tail(fetched=seq - 1, wanted=seq)
        elif seq <= tail.fetched:
            return  # already read ahead
        tail.wanted = max(tail.wanted, seq)
        self._pending.add(key)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())

    def _carried(self, key: uuid.UUID, first: int, items: list[list[Any]]) -> None:
        """Events that came with their announcement: handed on at once when they follow what was handed on before
        and no read is under way (which keeps seq order); otherwise announced, so the log is read. The caller checked
        that someone here follows the thread."""
        if not items:
            return
        last = first + len(items) - 1
        tail = self._tails.get(key)
        if tail is None:
            tail = self._tails[key] = _Tail(fetched=first - 1, wanted=first - 1)
        if tail.fetched >= last:
            return  # read ahead already
        if tail.fetched != first - 1 or tail.wanted > tail.fetched:
            self._stored(key, last)  # read up to its last event (a page may have ended inside the batch)
            return
        entries = [Entry(first + i, str(type_), data, json.dumps(data)) for i, (type_, data) in enumerate(items)]
        tail.wanted = entries[-1].seq
        self._hand_over(key, tail, entries)

    async def _fetch(self, afters: dict[uuid.UUID, int]) -> dict[uuid.UUID, list[Entry]]:
        """The events after each key's position: the threads' in one query on the LISTEN connection (the drain is
        its only reader), the lifecycle log's (low volume) on a session."""
        found: dict[uuid.UUID, list[Entry]] = {}
        if events.LIFECYCLE in afters:
            async with db.autocommit(self._sessions) as session:
                rows = await events.read_lifecycle(session, None, afters[events.LIFECYCLE], events.PAGE)
            found[events.LIFECYCLE] = [Entry.of(row) for row in rows]
        threads = {k: v for k, v in afters.items() if k != events.LIFECYCLE}
        if threads:
            if self._conn is None or self._conn.is_closed():
                raise ConnectionError("the event listener is reconnecting")
            for key, records in (await events.read_many(self._conn, threads, events.PAGE)).items():
                found[key] = [Entry(r["seq"], r["type"], json.loads(r["text"]), r["text"]) for r in records]
        return found

    async def _drain(self) -> None:
        """Read what was announced, once per process and in one query for all keys, and hand it to every
        subscriber in seq order; announcements that arrive meanwhile are read in the next round."""
        while self._pending:
            tails = {k: t for k in self._pending if (t := self._tails.get(k)) is not None and t.fetched < t.wanted}
            self._pending.clear()
            if not tails:
                continue
            found: dict[uuid.UUID, list[Entry]] = {}
            try:  # shielded: a cancelled drain must not cost the pool its connection
                found = await asyncio.shield(self._fetch({k: t.fetched for k, t in tails.items()}))
            except Exception:  # the database is unreachable: the subscribers read the log themselves, or fail
                log.exception("reading announced events failed")
            for key, tail in tails.items():
                if self._tails.get(key) is tail:  # still followed by someone
                    self._hand_over(key, tail, found.get(key, []))

    def _hand_over(self, key: uuid.UUID, tail: _Tail, entries: list[Entry]) -> None:
        if entries:
            batch = [Stored(entry.seq, entry) for entry in entries]
            for sub in list(self._subs.get(key, ())):
                sub.push_all(batch)
            tail.fetched = max(tail.fetched, entries[-1].seq)
        else:  # gone (retention, deletion) or unreadable: the subscribers ask the log
            self._push(key, Stored(tail.wanted))
            tail.fetched = tail.wanted
        if tail.fetched < tail.wanted:
            self._pending.add(key)  # a full page, or more announced meanwhile
        while tail.held and (tail.held[0][0] <= tail.fetched or tail.fetched >= tail.wanted):
            self._push(key, tail.held.popleft()[1])
