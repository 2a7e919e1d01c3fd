"""Scheduled effects (`semantics.md` §10): durable rows the worker's timer turns into `effect` inbox rows when due.

Statuses (`Status`), in the order an effect goes through them:

- `scheduled` — waiting for `run_at`; the only rows the timer looks at (partial index `effects_due`).
- `queued` — due: an `effect` inbox row carries it into the thread's single flight.
- `running` — its handler started (`attempts` counts the starts). A worker that crashes leaves it here with its inbox
  row in place, so the thread's next execution runs it again (at least once), up to `MAX_ATTEMPTS` starts.
- `done` — the handler returned. `failed` — it raised (`last_error`), its arguments no longer validate, its
  definition is gone, or it crashed its worker `MAX_ATTEMPTS` times. `cancelled` — removed before it started
  (the API, `state.remove_scheduled_effect`, or the thread's termination).

Every query is here, named and commented; the caller owns the transaction.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from app import errors, inputs, queue, tables

MAX_ATTEMPTS = 3  # starts of one effect (crashed workers included) before it is failed instead of run again


class Status(StrEnum):
    """Effect statuses (what each means: the module docstring)."""

    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


PENDING = (Status.SCHEDULED, Status.QUEUED)  # not started yet: still cancellable


async def schedule(
    session: AsyncSession, thread_id: uuid.UUID, name: str, args: dict[str, Any], delay_ms: float
) -> tables.Effect:
    """Store an effect due `delay_ms` from now, by the database clock (the timer compares with `now()` too)."""
    # SCHEDULE: run_at = now() + delay, so worker clocks never matter.
    query = (
        insert(tables.Effect)
        .values(
            id=uuid.uuid4(),
            thread_id=thread_id,
            name=name,
            args=args,
            run_at=func.now() + timedelta(milliseconds=delay_ms),
        )
        .returning(tables.Effect)
    )
    return (await session.execute(query)).scalar_one()


async def list_(
    session: AsyncSession, thread_id: uuid.UUID, *, name: str | None = None, pending: bool = False
) -> list[tables.Effect]:
    """The thread's effects by due time; `pending` keeps only those not started yet."""
    query = select(tables.Effect).where(tables.Effect.thread_id == thread_id)
    if name is not None:
        query = query.where(tables.Effect.name == name)
    if pending:
        query = query.where(tables.Effect.status.in_(PENDING))
    query = query.order_by(tables.Effect.run_at, tables.Effect.created_at)
    return list((await session.execute(query)).scalars())


async def get(session: AsyncSession, thread_id: uuid.UUID, effect_id: uuid.UUID) -> tables.Effect:
    """One effect of the thread, or `EffectNotFound`."""
    row = await session.get(tables.Effect, effect_id, populate_existing=True)
    if row is None or row.thread_id != thread_id:
        raise errors.EffectNotFound()
    return row


# CANCEL: only an effect that has not started may be cancelled; a queued one's inbox row is skipped on delivery.
_CANCEL = (
    update(tables.Effect)
    .where(tables.Effect.status.in_(PENDING))
    .values(status=Status.CANCELLED, updated_at=func.now())
    .returning(tables.Effect.id)
)


async def cancel(session: AsyncSession, thread_id: uuid.UUID, effect_id: uuid.UUID) -> bool:
    """Cancel an effect that has not started; False if it was cancelled already, `EffectNotCancellable` if it
    started, `EffectNotFound` if the thread has no such effect."""
    query = _CANCEL.where(tables.Effect.id == effect_id, tables.Effect.thread_id == thread_id)
    if (await session.execute(query)).first() is not None:
        return True
    row = await get(session, thread_id, effect_id)
    if row.status == Status.CANCELLED:
        return False
    raise errors.EffectNotCancellable(f"Effect {effect_id} is {row.status}; only a scheduled effect can be cancelled")


async def cancel_all(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """The thread was terminated: cancel its effects that have not started, fail one that is running."""
    await session.execute(_CANCEL.where(tables.Effect.thread_id == thread_id))
    await session.execute(
        update(tables.Effect)
        .where(tables.Effect.thread_id == thread_id, tables.Effect.status == Status.RUNNING)
        .values(status=Status.FAILED, last_error="the thread was terminated while it ran", updated_at=func.now())
    )


# CLAIM_DUE: due scheduled effects, oldest first, skipping rows (and threads) another transaction holds — so two
# timers never take the same row, and the timer never waits on a thread row a run has locked (the next poll gets
# it); each becomes `queued` with an `effect` inbox row, and its thread becomes runnable, and the workers are woken
# (delivered at commit) when any was, in this one statement (the inbox and lease writes outside `app/queue.py`: its
# docstring lists them).
_CLAIM_DUE = text(
    """
    WITH due AS (
        SELECT e.id FROM effects e JOIN threads t ON t.id = e.thread_id
        WHERE e.status = 'scheduled' AND e.run_at <= now() AND t.terminated_at IS NULL
        ORDER BY e.run_at
        LIMIT :limit
        FOR NO KEY UPDATE OF e, t SKIP LOCKED
    ), queued AS (
        UPDATE effects SET status = 'queued', updated_at = now()
        FROM due WHERE effects.id = due.id
        RETURNING effects.id, effects.thread_id, effects.name, effects.run_at
    ), inboxed AS (
        INSERT INTO inbox (thread_id, kind, payload)
        SELECT thread_id, :kind, jsonb_build_object('effect_id', id, 'name', name) FROM queued ORDER BY run_at, id
        RETURNING thread_id
    ), woken AS (
        UPDATE threads SET runnable_since = coalesce(runnable_since, now())
        WHERE id IN (SELECT thread_id FROM inboxed)
    )
    SELECT count(*) AS n, CASE WHEN count(*) > 0 THEN pg_notify(:channel, '') END AS woke FROM inboxed
    """
)


async def claim_due(session: AsyncSession, limit: int) -> int:
    """Move up to `limit` due effects into their threads' inboxes; workers are woken at commit. Returns how many.
    One statement, the wake-up in it."""
    params = {"limit": limit, "kind": inputs.Kind.EFFECT, "channel": queue.WAKEUP_CHANNEL}
    return int((await session.execute(_CLAIM_DUE, params)).scalar_one())


async def start(session: AsyncSession, item: tables.Inbox) -> tables.Effect | None:
    """Begin the effect an inbox row carries: count the start and mark it `running`, or return None (consuming the
    inbox row) when it must not run — cancelled, gone, finished, or crashed `MAX_ATTEMPTS` times already."""
    effect = inputs.read(item.kind, item.payload)
    assert isinstance(effect, inputs.EffectInput)  # `next_effect` reads effect rows only
    row = await session.get(tables.Effect, effect.effect_id, with_for_update=True, populate_existing=True)
    if row is None or row.status not in (Status.QUEUED, Status.RUNNING):
        await queue.drop(session, item.id)
        return None
    if row.attempts >= MAX_ATTEMPTS:  # it was running each time its worker died
        await finish(session, row, item, f"the effect crashed its worker {row.attempts} times; not run again")
        return None
    row.status = Status.RUNNING
    row.attempts += 1
    row.updated_at = datetime.now(UTC)
    await session.flush()
    return row


async def finish(session: AsyncSession, row: tables.Effect, item: tables.Inbox, error: str | None) -> None:
    """Record how the handler ended and consume its inbox row, in one transaction (so a crash before runs it again)."""
    await session.execute(
        update(tables.Effect)
        .where(tables.Effect.id == row.id)
        .values(status=Status.FAILED if error else Status.DONE, last_error=error, updated_at=func.now())
    )
    await queue.drop(session, item.id)


# EXPIRE: retention (`EFFECT_RETENTION_DAYS`, `app/retention.py`): at most `batch` finished effects (done, failed,
# cancelled) by when they finished (`updated_at`), through the partial index `effects_finished`, whose predicate the
# statuses are written as (a parameter would not match it); how many went.
_EXPIRE = text("""
    WITH gone AS (
        DELETE FROM effects WHERE id IN (
            SELECT id FROM effects
            WHERE status IN ('done', 'failed', 'cancelled') AND updated_at < now() - make_interval(secs => :age)
            LIMIT :batch
        )
        RETURNING 1
    )
    SELECT count(*) FROM gone
""")


async def expire(session: AsyncSession, age_seconds: float, batch: int) -> int:
    """Delete one batch of effects finished more than `age_seconds` ago; returns how many went."""
    return int((await session.execute(_EXPIRE, {"age": float(age_seconds), "batch": batch})).scalar_one())
