"""A posted input's turn, followed on the thread's event log until it ends (`POST /threads/{id}/messages?wait=`).

The input's turn has ended once, after its delivery (the `message_data` of its id), the thread comes to rest:
`idle` (an `ai_human` turn ended, a `dual_ai` session ended, or the input started nothing), `stopped` or
`terminated`. Input queued behind a running turn is delivered into it (its end is then that turn's end) or starts a
turn of its own later; either way its own delivery comes first. Before its delivery, a stop parks it (it waits for a
human message or `continue`), and a delivery that fails sets it aside: both end the wait too.

The log is read from a position taken before the input was queued, and followed through the hub (which hears every
process's events by `NOTIFY`) as the event streams follow it, holding no connection while it waits.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import errors, events, inputs, keys, queue, tables, threads
from app.hub import Batch, Hub, Live, Overflow, Subscription

RESTING = frozenset({threads.Status.IDLE, threads.Status.STOPPED, threads.Status.TERMINATED})
PAGE = 500  # stored events read per query


@dataclass
class Turn:
    """What the log has told of one input's turn so far."""

    message_id: uuid.UUID
    status: str | None = None  # the thread's latest status the log showed
    delivered: bool = False
    done: bool = False
    parked: bool = False  # stopped (or terminated) before its delivery: nothing runs it until someone acts
    check_aside: bool = False  # an input was set aside before this one's delivery: perhaps this one
    produced: dict[uuid.UUID, None] = field(default_factory=dict)  # messages of the turn, in order (depth 0)

    def see(self, type_: str, data: dict[str, Any]) -> None:
        if self.done:
            return
        if type_ == "message_data" and int(data.get("depth", 0) or 0) == 0:
            try:
                message_id = uuid.UUID(str(data.get("message_id")))
            except ValueError:
                return
            self.delivered = self.delivered or message_id == self.message_id
            if self.delivered:
                self.produced[message_id] = None
        elif type_ == "thread_status":
            self.status = str(data.get("status"))
            if self.delivered:
                self.done = self.status in RESTING
            else:  # a stop parks it; the `queued` of a human message that ends the stop (its own) does not
                self.parked = self.status in (threads.Status.STOPPED, threads.Status.TERMINATED)
        elif type_ == "thread_terminated":  # ends its turn, or leaves it never delivered
            self.status = threads.Status.TERMINATED
            self.done, self.parked = self.delivered, not self.delivered
        elif type_ == "error" and data.get("code") == "input_set_aside" and not self.delivered:
            self.check_aside = True

    @property
    def over(self) -> bool:
        """Nothing more to wait for: the turn ended, or the input cannot run until someone acts."""
        return self.done or self.parked


async def queued(session: AsyncSession, thread_id: uuid.UUID, message_id: uuid.UUID) -> tables.Inbox | None:
    """The input's inbox row while it is not delivered: waiting, or set aside (its delivery failed)."""
    for row in await queue.pending(session, thread_id):
        if row.kind == inputs.Kind.MESSAGE and str(row.payload.get("id")) == str(message_id):
            return row
    return None


async def follow(
    hub: Hub,
    sessions: async_sessionmaker[AsyncSession],
    thread_id: uuid.UUID,
    api_key: uuid.UUID | None,
    after: int,
    turn: Turn,
) -> None:
    """Read the thread's log after `after` into `turn`, then follow it live, until the turn is `over` (the caller
    bounds the time); `Unauthorized` once the caller's key is revoked, as for a stream."""

    async def backlog(position: int) -> Sequence[tables.Event]:
        async with sessions() as session:
            return await events.read(session, thread_id, position, PAGE)

    async def aside() -> bool:
        async with sessions() as session:
            row = await queued(session, thread_id, turn.message_id)
            return row is not None and row.set_aside_at is not None

    position = after
    while True:
        sub = hub.subscribe(thread_id, api_key)  # subscribe first, then read the log: nothing falls between
        try:
            while True:
                # shielded: a wait that ends mid-query must not cost the pool its connection
                rows = await asyncio.shield(backlog(position))
                for row in rows:
                    position = row.seq
                    turn.see(row.type, row.data)
                if len(rows) == PAGE and not turn.over:
                    continue
                while not turn.over:
                    if turn.check_aside:
                        turn.check_aside = False
                        if await asyncio.shield(aside()):
                            turn.done = True
                            return
                    await sub.wait()
                    position, caught_up = _take(sub, position, turn)
                    if not caught_up:
                        break  # read the log
                if turn.over:
                    return
        except Overflow:  # cut off: its key was revoked, or the hub's listener reconnected (then go on)
            if not await asyncio.shield(_allowed(sessions, api_key)):
                raise errors.Unauthorized("The key this request was made with has been revoked.") from None
        finally:
            hub.unsubscribe(sub)


async def _allowed(sessions: async_sessionmaker[AsyncSession], api_key: uuid.UUID | None) -> bool:
    """Whether the caller may still read the thread: its key is not revoked (open mode: no key exists yet)."""
    async with sessions() as session:
        if api_key is None:
            return await keys.active_count(session) == 0
        return not await keys.revoked(session, {api_key})


def _take(sub: Subscription, position: int, turn: Turn) -> tuple[int, bool]:
    """Feed `turn` what `sub` has buffered after `position`; the new position, and False when an announced event
    must be read from the log (the hub could not read it, or a seq was skipped)."""
    while sub.items:
        delivery = sub.items.popleft()
        for item in delivery.items if isinstance(delivery, Batch) else (delivery,):
            if isinstance(item, Live) or item.seq <= position:
                continue  # a delta, or already seen
            if item.entry is None or item.seq != position + 1:
                return position, False
            position = item.seq
            turn.see(item.entry.type, item.entry.data)
    return position, True
