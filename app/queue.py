"""The durable per-thread queue: enqueue (+NOTIFY), claim (SKIP LOCKED), fence, heartbeat, release.

Every query the queue runs is here, named and commented. Scheduling state lives on `threads`:
`runnable_since` (set while input waits or a run must go on), `lease_token` / `lease_owner` /
`lease_expires_at` (who runs it, until when, by the database clock) and `attempt` (claims of the current step).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app import errors, tables

WAKEUP_CHANNEL = "agents_wakeup"


class Kind:
    """Inbox row kinds."""

    MESSAGE = "message"
    CONTINUE = "continue"
    TOOL = "tool"  # `state.queue_tool` outside a tool call: `{call: ToolCall}`
    SPAWN = "spawn"  # a new thread whose side A prompt has `immediate` subagents: start them (§6.6)
    CHILD_RESULT = "child_result"  # a blocking child's session ended: `{call_id, name, child_id, status, content,
    # attachments}` answers the parent's open tool call
    EFFECT = "effect"  # a due effect (`app/effects.py`): `{effect_id, name}`; consumed when its handler finished


@dataclass(frozen=True)
class Claim:
    """A worker's hold on one thread: the fencing token every commit is conditioned on."""

    thread_id: uuid.UUID
    token: uuid.UUID
    attempt: int


async def enqueue(session: AsyncSession, thread_id: uuid.UUID, kind: str, payload: dict[str, Any]) -> int:
    """Add input to a thread's inbox and mark it runnable; workers are woken at commit."""
    row = tables.Inbox(thread_id=thread_id, kind=kind, payload=payload)
    session.add(row)
    await session.flush()
    await mark_runnable(session, thread_id)
    return row.id


async def mark_runnable(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """Keep (or set) `runnable_since` and wake a worker when the transaction commits."""
    # MARK_RUNNABLE: the oldest wait wins the claim order, so keep an existing timestamp.
    await session.execute(
        text("UPDATE threads SET runnable_since = coalesce(runnable_since, now()) WHERE id = :id"),
        {"id": thread_id},
    )
    await session.execute(select(func.pg_notify(WAKEUP_CHANNEL, "")))


# CLAIM: the oldest runnable thread whose lease is absent or expired, skipping rows another claimer locked.
# A thread parked on a blocking child (`waiting`), stopped by its user or terminated is never claimed.
_CLAIM = text(
    """
    UPDATE threads SET lease_token = :token, lease_owner = :owner,
           lease_expires_at = now() + make_interval(secs => :lease), attempt = attempt + 1
    WHERE id = (
        SELECT id FROM threads
        WHERE runnable_since IS NOT NULL
          AND (lease_expires_at IS NULL OR lease_expires_at < now())
          AND terminated_at IS NULL AND NOT stopped AND status <> 'waiting'
        ORDER BY runnable_since
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    )
    RETURNING id, attempt
    """
)


async def claim(session: AsyncSession, owner: str, lease_seconds: float) -> Claim | None:
    """Take the lease of one runnable thread, or None when nothing is runnable."""
    token = uuid.uuid4()
    row = (await session.execute(_CLAIM, {"token": token, "owner": owner, "lease": lease_seconds})).first()
    if row is None:
        return None
    return Claim(thread_id=row.id, token=token, attempt=row.attempt)


async def fence(session: AsyncSession, claim: Claim) -> tables.Thread:
    """Lock the thread row if, and only if, this claim still holds its lease; else `LeaseLost`."""
    # FENCE: the token in the WHERE makes every write of a run conditional on still owning it.
    thread = (
        await session.execute(
            select(tables.Thread)
            .where(tables.Thread.id == claim.thread_id, tables.Thread.lease_token == claim.token)
            .with_for_update(key_share=True)  # FOR NO KEY UPDATE (see `app/lifecycle.py`)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
    if thread is None:
        raise errors.LeaseLost()
    return thread


# HEARTBEAT: renew every lease this process holds in one statement; a missing id is a lost lease. If it ever closes a
# lock cycle (with a terminate or delete cascade locking a parent, then its children), Postgres breaks the cycle and
# the worker simply beats again at the next interval.
_HEARTBEAT = text(
    """
    UPDATE threads SET lease_expires_at = now() + make_interval(secs => :lease)
    WHERE (id, lease_token) IN (SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:tokens AS uuid[])))
    RETURNING id
    """
)


async def heartbeat(conn: AsyncConnection, claims: list[Claim], lease_seconds: float) -> set[uuid.UUID]:
    """Renew the leases of `claims` (the caller owns the transaction); return the ids whose lease was lost."""
    if not claims:
        return set()
    rows = await conn.execute(
        _HEARTBEAT,
        {"ids": [c.thread_id for c in claims], "tokens": [c.token for c in claims], "lease": lease_seconds},
    )
    kept = {r.id for r in rows}
    return {c.thread_id for c in claims} - kept


async def take_inbox(session: AsyncSession, thread_id: uuid.UUID) -> list[tables.Inbox]:
    """Remove and return the thread's pending input in order (the caller holds the fenced row lock).

    Effect rows stay: each is removed by `drop` in the transaction that records its handler's end (`next_effect`).
    """
    query = (
        delete(tables.Inbox)
        .where(tables.Inbox.thread_id == thread_id, tables.Inbox.kind != Kind.EFFECT)
        .returning(tables.Inbox)
    )
    return sorted((await session.execute(query)).scalars(), key=lambda r: r.id)


async def next_effect(session: AsyncSession, thread_id: uuid.UUID) -> tables.Inbox | None:
    """The thread's oldest effect inbox row, left in place until its handler finished."""
    query = (
        select(tables.Inbox)
        .where(tables.Inbox.thread_id == thread_id, tables.Inbox.kind == Kind.EFFECT)
        .order_by(tables.Inbox.id)
        .limit(1)
    )
    return (await session.execute(query)).scalar_one_or_none()


async def drop(session: AsyncSession, inbox_id: int) -> None:
    """Remove one inbox row."""
    await session.execute(delete(tables.Inbox).where(tables.Inbox.id == inbox_id))


async def pending(session: AsyncSession, thread_id: uuid.UUID) -> list[tables.Inbox]:
    """The thread's undelivered input, oldest first."""
    query = select(tables.Inbox).where(tables.Inbox.thread_id == thread_id).order_by(tables.Inbox.id)
    return list((await session.execute(query)).scalars())


# RELEASE: drop the lease; stay runnable only if input arrived meanwhile (or the run asks to go on).
_RELEASE = text(
    """
    UPDATE threads SET lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
           attempt = CASE WHEN :keep_attempt THEN attempt - 1 ELSE 0 END,
           runnable_since = CASE
               WHEN :again OR EXISTS (SELECT 1 FROM inbox WHERE inbox.thread_id = threads.id)
               THEN coalesce(runnable_since, now()) ELSE NULL END
    WHERE id = :id AND lease_token = :token
    RETURNING runnable_since
    """
)


async def release(session: AsyncSession, claim: Claim, *, again: bool = False, keep_attempt: bool = False) -> bool:
    """Give the thread back; `again` keeps it runnable, `keep_attempt` refunds this claim (graceful stop).

    Returns whether the thread is still runnable (a worker is woken at commit if so).
    """
    row = (
        await session.execute(
            _RELEASE,
            {"id": claim.thread_id, "token": claim.token, "again": again, "keep_attempt": keep_attempt},
        )
    ).first()
    if row is None:
        raise errors.LeaseLost()
    if row.runnable_since is not None:
        await session.execute(select(func.pg_notify(WAKEUP_CHANNEL, "")))
        return True
    return False
