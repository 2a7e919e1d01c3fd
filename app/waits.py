"""A posted input's turn, followed on the thread's event log until it ends (`POST /threads/{id}/messages?wait=`).

The input's turn has ended once, after its delivery (the `message_data` of its id), the thread comes to rest:
`idle` (an `ai_human` turn ended, a `dual_ai` session ended, or the input started nothing), `stopped` or
`terminated`. Input queued behind a running turn is delivered into it (its end is then that turn's end) or starts a
turn of its own later; either way its own delivery comes first. Before its delivery, a stop parks it (it waits for a
human message or `continue`), and a delivery that fails sets it aside: both end the wait too.

How it ended (`Turn.outcome`) is read from the same log, after the input's delivery: `completed`, unless an `error`
event or a `session_ended` with status `failure` says it `failed` (`Turn.error` says why), or the thread was stopped
(`stopped`) or terminated (`terminated`); a delivery that failed is `failed` too (`input_set_aside`).

The log is read from a position taken before the input was queued, and followed through the hub (which hears every
process's events by `NOTIFY`) as the event streams follow it, holding no connection while it waits.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import errors, events, inputs, keys, queue, tables, threads
from app.hub import Batch, Hub, Live, Overflow, Subscription

RESTING = frozenset({threads.Status.IDLE, threads.Status.STOPPED, threads.Status.TERMINATED})
SET_ASIDE = "input_set_aside"  # the `error` code of an input whose delivery failed (`Engine._run_all`)
Outcome = Literal["completed", "failed", "stopped", "terminated"]

# why a session that ended `failure` without an `error` event failed, by its `session_ended` reason
_ENDED = {
    "max_total_steps": "The session reached its step limit (MAX_SESSION_STEPS) and was failed.",
    "max_session_turns": "The session reached its agent's max_session_turns and was failed.",
    "session_fail": "A side ended the session as failed (its session_fail tool).",
}


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
    failure: dict[str, str] | None = None  # the last `error` event after its delivery: `{code, message}`
    ended: dict[str, Any] | None = None  # the `session_ended` after its delivery

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
        elif type_ == "error" and data.get("code") == SET_ASIDE and not self.delivered:
            self.check_aside = True
        elif type_ == "error" and data.get("code") != SET_ASIDE and self.delivered:  # another input's is not its own
            self.failure = {"code": str(data.get("code")), "message": str(data.get("message"))}
        elif type_ == "session_ended" and self.delivered:
            self.ended = data

    def set_aside(self, reason: str) -> None:
        """Its delivery failed: the input was set aside, which ends the wait."""
        self.done = True
        self.failure = {"code": SET_ASIDE, "message": reason}

    @property
    def over(self) -> bool:
        """Nothing more to wait for: the turn ended, or the input cannot run until someone acts."""
        return self.done or self.parked

    @property
    def outcome(self) -> Outcome | None:
        """How the turn ended; `None` while it has not."""
        if not self.done:
            return None
        reason = (self.ended or {}).get("reason")
        if self.status == threads.Status.TERMINATED or reason == "terminated":
            return "terminated"
        if self.status == threads.Status.STOPPED or reason == "stopped_by_user":
            return "stopped"
        return "failed" if self.error is not None else "completed"

    @property
    def error(self) -> dict[str, str] | None:
        """Why the turn failed: its `error` event, else the reason its session ended `failure`; `None` otherwise."""
        if self.failure is not None:
            return self.failure
        ended = self.ended or {}
        reason = str(ended.get("reason"))
        if ended.get("status") != threads.SessionStatus.FAILURE or reason in ("terminated", "stopped_by_user"):
            return None
        result = ended.get("result")
        said = result.get("content") if isinstance(result, dict) else None
        return {"code": reason, "message": str(said) if said else _ENDED.get(reason, f"The session failed: {reason}.")}


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
            return await events.read(session, thread_id, position, events.PAGE)

    async def aside() -> str | None:
        """Why the input was set aside, if it was."""
        async with sessions() as session:
            row = await queued(session, thread_id, turn.message_id)
            return (row.error or "") if row is not None and row.set_aside_at is not None else None

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
                if len(rows) == events.PAGE and not turn.over:
                    continue
                while not turn.over:
                    if turn.check_aside:
                        turn.check_aside = False
                        if (reason := await asyncio.shield(aside())) is not None:
                            turn.set_aside(reason)
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
