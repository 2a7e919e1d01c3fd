"""A worker's hold on a thread: the claim that takes its lease (SKIP LOCKED), the fence that proves it in every
transaction of the execution, and the guard of a statement that is its own transaction. The lease's renewal is
`heartbeat`'s, its end `queue.release`'s; `queue`'s docstring says where the scheduling state lives."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession

from app import db, errors, events, statements, tables


@dataclass
class Claim:
    """A worker's hold on one thread: the fencing token every commit is conditioned on. `releasing` is set when its
    execution starts to give it back, before the releasing statement: a heartbeat that read the claims before that
    commit and the database after it finds the lease gone, and must not take it for lost (`Worker._cancel_lost`)."""

    thread_id: uuid.UUID
    token: uuid.UUID
    attempt: int
    releasing: bool = field(default=False, compare=False)
    claimed_at: float | None = field(default=None, compare=False)  # `time.monotonic()` as the claim was sent
    # the thread row as the claim left it (its columns by name, and its version): the execution's first transaction
    # starts from it and takes the lock in its first read (`statements.fence_later`)
    row: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    xmin: int | None = field(default=None, compare=False)


# CLAIM: the oldest runnable thread whose lease is absent or expired, skipping thread rows locked by another claimer
# or by a transaction of the execution that holds it, and the threads the claiming worker still runs (an expired lease
# nobody else took is still its own: no second execution). A thread parked on a blocking child (`waiting`), stopped
# by its user or terminated is never claimed. The lease row is taken only if it is still expired when locked (a
# heartbeat renewing it concurrently wins: then nothing is claimed and the worker tries again).
_CLAIM = """
    WITH candidate AS (
        SELECT t.id FROM threads t
        WHERE t.runnable_since IS NOT NULL
          AND t.terminated_at IS NULL AND NOT t.stopped AND t.status <> 'waiting'
          AND t.id <> ALL(CAST($1 AS uuid[]))
          AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.thread_id = t.id AND l.expires_at >= now())
        ORDER BY t.runnable_since
        LIMIT $4
        FOR NO KEY UPDATE OF t SKIP LOCKED
    ),
    leased AS (
        INSERT INTO leases (thread_id, token, expires_at)
        SELECT id, gen_random_uuid(), now() + make_interval(secs => $2) FROM candidate
        ON CONFLICT (thread_id) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at
        WHERE leases.expires_at < now()
        RETURNING thread_id, token
    )
    UPDATE threads SET lease_token = leased.token, lease_owner = $3, attempt = threads.attempt + 1
    FROM leased WHERE threads.id = leased.thread_id
    RETURNING {columns}, threads.xmin AS row_xmin
"""
# the claimed rows' columns, JSON ones as text: a claimer's own connection decodes no JSON (`_claimed` does)
_JSON_COLUMNS = [c.name for c in sa_inspect(tables.Thread).columns if isinstance(c.type, JSON)]
_CLAIM = _CLAIM.format(
    columns=", ".join(
        f"threads.{c.name}::text AS {c.name}" if c.name in _JSON_COLUMNS else f"threads.{c.name}"
        for c in sa_inspect(tables.Thread).columns
    )
)


def _claimed(record: Any) -> dict[str, Any]:
    """A claimed row's columns as `statements.attach` takes them."""
    row = dict(record.items())
    for name in _JSON_COLUMNS:
        row[name] = None if row[name] is None else json.loads(row[name])
    return row


async def claim_many(
    conn: db.Fetcher, owner: str, lease_seconds: float, running: Sequence[uuid.UUID], limit: int
) -> list[Claim]:
    """Take the leases of up to `limit` runnable threads other than those in `running`, oldest first, each with a
    token of its own. One atomic statement: run it outside a transaction (the worker's own connection, or a `Driver`
    in autocommit). Fewer than `limit` means nothing else was runnable (or was being claimed by someone else)."""
    sent = time.monotonic()  # the lease runs from the statement's start: the heartbeat dates its first renewal by it
    rows = await conn.fetch(_CLAIM, list(running), float(lease_seconds), owner, limit)
    return [
        Claim(r["id"], r["lease_token"], r["attempt"], claimed_at=sent, row=_claimed(r), xmin=r["row_xmin"])
        for r in rows
    ]


async def claim(conn: db.Fetcher, owner: str, lease_seconds: float, running: Sequence[uuid.UUID] = ()) -> Claim | None:
    """`claim_many` of one thread: its claim, or None when nothing is runnable."""
    found = await claim_many(conn, owner, lease_seconds, running, 1)
    return found[0] if found else None


# FENCE: the token in the WHERE makes every write of a run conditional on still owning it; an expired lease (the
# heartbeat could not renew it for a whole lease) is lost too, as another worker may claim it any moment.
_FENCE = """
    SELECT * FROM threads t
    WHERE t.id = $1 AND t.lease_token = $2
      AND EXISTS (SELECT 1 FROM leases l WHERE l.thread_id = $1 AND l.token = $2 AND l.expires_at > now())
    FOR NO KEY UPDATE OF t
"""


async def fence(session: AsyncSession, claim: Claim) -> tables.Thread:
    """Lock the thread row if, and only if, this claim still holds its lease; else `LeaseLost`. The session's first
    statement: the row comes back as its ORM object."""
    found = await (await statements.driver(session)).fetchrow(_FENCE, claim.thread_id, claim.token)
    if found is None:
        raise errors.LeaseLost()
    thread: tables.Thread = statements.attach(session, tables.Thread, found)
    return thread


# FENCE LATER: `FENCE` for a transaction that starts from the row as its execution's last commit left it (`$3`, that
# version's xmin), sent with its first statement (`statements.fence_later`): alone, it waits for the lock as `FENCE`
# does; as the CTE of a read it never waits (SKIP LOCKED). Either selects nothing when the row changed since (a lock
# taken after a wait is on the newest version, and the condition is checked again on it), is locked by another (the
# CTE), or the lease is gone.
_FENCE_LATER = """
    SELECT 1 FROM threads t
    WHERE t.id = ${0} AND t.lease_token = ${1} AND t.xmin = ${2}
      AND EXISTS (SELECT 1 FROM leases l WHERE l.thread_id = ${0} AND l.token = ${1} AND l.expires_at > now())
    FOR NO KEY UPDATE OF t
"""


def fence_later(claim: Claim, xmin: int) -> statements.Fence:
    """The fence of a transaction of `claim` that starts from the row's version `xmin` (`statements.fence_later`)."""

    def numbered(first: int) -> str:
        return _FENCE_LATER.format(first, first + 1, first + 2)

    return statements.Fence(
        alone=numbered(1),
        cte=lambda first: f"fence AS ({numbered(first)} SKIP LOCKED)",
        args=(claim.thread_id, claim.token, xmin),
    )


# GUARD: the condition of a statement that is its own transaction (`events.Guard`, the engine's writes-only
# transactions): the thread row is the version the execution's last commit left (`$1`, its xmin: nobody wrote it
# since, so everything read from it still holds) and the claim (`$2`) still holds a live lease, as `FENCE` checks.
_GUARD = (
    "xmin = $1 AND lease_token = $2 AND EXISTS "
    "(SELECT 1 FROM leases l WHERE l.thread_id = threads.id AND l.token = $2 AND l.expires_at > now())"
)


def guard(driver: db.Driver, claim: Claim, xmin: int) -> events.Guard:
    """The guard of a writes-only transaction of `claim` on `driver` (autocommit), from the row's version `xmin`."""
    return events.Guard(driver, _GUARD, (xmin, claim.token))
