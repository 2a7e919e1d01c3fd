"""The thread's messages as a worker keeps them between steps, and between executions of the same thread.

A step needs the whole history (to build the request and find unfinished work), but reading and mapping every row
again would make a step of a 1,000-message thread cost far more than one of a 10-message thread. So the worker
keeps the rows it read and, at each step, reads only those written since (`changes.changed`: revisions are stamped
by the database under the thread row lock, which the step holds too). That holds whoever wrote in between (another
worker, the API), so a thread's next execution on this worker picks up where the last one left off. A deletion
(`messages.remove`, rare) bumps a counter on the thread row and makes the next step read everything again.

Next to each ORM row it keeps a `Seen`: the fields a request is built from, as plain attributes. Building a request
reads every row's fields, and an ORM attribute is many times slower to read than a slot. And it keeps the model's
messages made of them (`transcript.Transcript`), so a step makes only those of the rows that are new.
"""

from __future__ import annotations

import bisect
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import changes, queue, tables
from app.engine import transcript
from app.spec.definitions import Side


@dataclass(frozen=True, slots=True)
class Seen:
    """A message's fields that building a request reads (`transcript.HistoryRow`), copied once from its row; frozen,
    so a `transcript.Transcript` may keep what it made of it."""

    id: uuid.UUID
    position: int
    role: str
    side: Side | None
    status: str
    depth: int
    content: str | None
    name: str | None
    tool_calls: list[Any] | None
    tool_call_id: str | None
    attachments: list[Any]
    prompt: str | None
    reasoning_content: str | None
    reasoning_details: list[Any] | None

    @classmethod
    def of(cls, row: tables.Message) -> Seen:
        return cls(
            row.id,
            row.position,
            row.role,
            row.side,
            row.status,
            row.depth,
            row.content,
            row.name,
            row.tool_calls,
            row.tool_call_id,
            row.attachments,
            row.prompt,
            row.reasoning_content,
            row.reasoning_details,
        )


HELD_ROWS = 20_000  # messages a worker keeps across its threads' histories (a few KB each)


class History:
    """A worker's copy of a thread's messages, in position order."""

    def __init__(self) -> None:
        self._removed = -1  # `threads.messages_removed` when last read in full
        self.transcript = transcript.Transcript()  # the model's messages made of the rows (`seen`), kept
        self._reset()

    def _reset(self) -> None:
        self._rows: list[tables.Message] = []
        self._seen: list[Seen] = []  # `Seen.of` each row of `_rows`
        self._index: dict[object, int] = {}  # message id -> its index in `_rows`
        self._rev = 0  # the highest revision read
        self.unwritten = False  # whether it holds rows `add`ed by a transaction that has not committed yet

    async def rows(self, session: AsyncSession, thread: tables.Thread) -> list[tables.Message]:
        """The messages now, in order (the caller holds the thread row lock)."""
        self._check(thread)
        self._read(await changes.changed(session, thread.id, self._rev))
        return list(self._rows)

    async def rows_and_waiting(self, session: AsyncSession, thread: tables.Thread) -> tuple[bool, bool]:
        """`rows` and `queue.waiting` in one statement (`changes.changed_and_waiting`): whether input, and whether
        effects, wait; the messages are then `current` until the session writes one."""
        self._check(thread)
        found, input_waits, effects_wait = await changes.changed_and_waiting(session, thread.id, self._rev)
        self._read(found)
        return input_waits, effects_wait

    async def take(self, session: AsyncSession, thread: tables.Thread) -> tuple[bool, bool, list[queue.Input]]:
        """`rows_and_waiting`, and the input taken unless effects wait (`changes.changed_waiting_and_taking`): an
        execution's first look. The messages are then `current` until the session writes one; a message the input
        becomes at its place (`queue.Input.place`) is `add`ed, not read."""
        self._check(thread)
        found, *waiting, taken = await changes.changed_waiting_and_taking(session, thread.id, self._rev)
        self._read(found)
        input_waits, effects_wait = waiting
        return input_waits, effects_wait, taken

    def add(self, row: tables.Message) -> None:
        """A new message of the transaction under way, whose position is known (`queue.Input.place`), held before it
        is read: the next read returns it again, as written. Until that transaction commits it is `unwritten`."""
        assert row.position is not None, "only a message at a known place is held before it is read"
        self.unwritten = True
        self._put(row)

    def current(self) -> list[tables.Message]:
        """The messages as of the last read, in order."""
        return list(self._rows)

    def _check(self, thread: tables.Thread) -> None:
        """Start again when a message was deleted since the last read."""
        if thread.messages_removed != self._removed:
            self._reset()
            self._removed = thread.messages_removed

    def _read(self, found: list[tuple[tables.Message, int]]) -> None:
        for row, rev in found:
            self._rev = max(self._rev, rev)
            self._put(row)

    def __len__(self) -> int:
        return len(self._rows)

    def seen(self) -> list[Seen]:
        """The messages as of the last `rows`, as plain values."""
        return list(self._seen)

    def since(self, position: int) -> list[tables.Message]:
        """The rows at or after `position` (a turn's rows), in order."""
        return self._rows[self._at(position) :]

    def _at(self, position: int) -> int:
        return bisect.bisect_left(self._seen, position, key=lambda s: s.position)

    def _put(self, row: tables.Message) -> None:
        at = self._index.get(row.id)
        if at is not None:  # an update: same position
            self._rows[at], self._seen[at] = row, Seen.of(row)
            return
        if not self._seen or row.position > self._seen[-1].position:  # the usual case: a new last row
            self._index[row.id] = len(self._rows)
            self._rows.append(row)
            self._seen.append(Seen.of(row))
            return
        at = self._at(row.position)
        self._rows.insert(at, row)
        self._seen.insert(at, Seen.of(row))
        self._index = {r.id: i for i, r in enumerate(self._rows)}


class Histories:
    """The histories a worker keeps, by thread; beyond `budget` messages in all, the least recently used go. Sizes
    are counted when an execution ends (`trim`), so keeping account costs nothing per step."""

    def __init__(self, budget: int = HELD_ROWS) -> None:
        self._held: OrderedDict[uuid.UUID, History] = OrderedDict()
        self._sizes: dict[uuid.UUID, int] = {}  # each history's size when last counted
        self._total = 0  # their sum
        self._budget = budget

    def of(self, thread_id: uuid.UUID) -> History:
        """The thread's history, kept or new; now the most recently used."""
        held = self._held.pop(thread_id, None)
        if held is None:
            held = History()
        self._held[thread_id] = held
        return held

    def settle(self, thread_id: uuid.UUID, *, committed: bool) -> None:
        """A transaction on the thread ended: the rows its history holds before reading them (`History.add`) are
        written if it `committed`; else the history is dropped (with those rows, the ones read with them, from the
        session rolled back)."""
        held = self._held.get(thread_id)
        if held is not None and held.unwritten:
            if committed:
                held.unwritten = False
            else:
                self.drop(thread_id)

    def drop(self, thread_id: uuid.UUID) -> None:
        """Forget a thread's history (what it read may hold writes that were rolled back)."""
        self._held.pop(thread_id, None)
        self._total -= self._sizes.pop(thread_id, 0)

    def trim(self, thread_id: uuid.UUID) -> None:
        """Count the thread's history (its execution ended), then drop the least recently used histories while more
        than `budget` messages are held (the most recent one is always kept)."""
        held = self._held.get(thread_id)
        if held is not None:
            self._total += len(held) - self._sizes.get(thread_id, 0)
            self._sizes[thread_id] = len(held)
        while self._total > self._budget and len(self._held) > 1:
            oldest, _ = self._held.popitem(last=False)
            self._total -= self._sizes.pop(oldest, 0)
