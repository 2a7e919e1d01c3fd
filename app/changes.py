"""Changes: a thread's messages written since a revision, the first read of an engine step — with the inbox's state,
and, at an execution's start, the input it takes (`engine/history.py` keeps what they return).

Every query here is on `messages` (with `inbox` riding along); the caller owns the transaction.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import queue, statements, tables

# CHANGED: a thread's messages inserted or updated after revision `since`, with their revision now. Every write of a
# thread's messages happens under its thread row lock (a fenced engine transaction, or a lifecycle change that locks
# the row), and each takes its revision from one sequence while holding it, so a reader holding the lock that saw
# revision N has seen every row written at or below N: rows above N are exactly those written since. The writes
# deferred so far ride in the read; a statement does not see the rows its own CTEs write, so the messages they write
# come back from their RETURNING instead of the table (the table's version of a row one of them updates left out).
_CHANGED = "SELECT * FROM messages WHERE thread_id = $1 AND rev > $2"


def _riding(writes: list[tuple[str, list[Any]]]) -> tuple[list[tuple[str, list[Any]]], str, str]:
    """Deferred writes as the CTEs of a read of the messages changed since (`$1` the thread, `$2` the revision; theirs
    numbered on from `$3`): the writes as sent, their CTEs (with the comma that follows them), the changed rows."""
    own = [i for i, (sql, _) in enumerate(writes) if statements.writes_table(sql) == "messages"]
    writes = [(f"{sql} RETURNING *", args) if i in own else (sql, args) for i, (sql, args) in enumerate(writes)]
    # fixed fragments, CTE names and the deferred writes' own SQL: nothing of a caller's
    left_out = "".join(f" AND id NOT IN (SELECT id FROM w{i})" for i in own)  # noqa: S608
    returned = "".join(f" UNION ALL SELECT * FROM w{i} WHERE thread_id = $1" for i in own)  # noqa: S608
    return writes, f"{statements.ctes(writes, 3)}, " if writes else "", f"{_CHANGED}{left_out}{returned}"


async def changed(session: AsyncSession, thread_id: uuid.UUID, since: int) -> list[tuple[tables.Message, int]]:
    """The thread's messages written after revision `since`, in order, each with its current revision (read at every
    step: in plain SQL; rows the session holds are refreshed, as `populate_existing` would). The writes deferred so
    far ride in it."""
    writes, ctes, rows = _riding(statements.deferred(session))
    sql = f"WITH {ctes}changed AS ({rows}) SELECT * FROM changed ORDER BY position"  # noqa: S608 -- as `_riding`
    driver = await statements.driver(session, carries=bool(writes))
    found = await driver.fetch(sql, thread_id, since, *[a for _, args in writes for a in args])
    return [(statements.attach(session, tables.Message, row), row["rev"]) for row in found]


async def changed_and_waiting(
    session: AsyncSession, thread_id: uuid.UUID, since: int
) -> tuple[list[tuple[tables.Message, int]], bool, bool]:
    """`changed`, and `queue.waiting`'s whether input and whether effects wait, in one statement: a step's first read
    after the fence (both after the row lock is taken: its snapshot holds every write made under it). The writes
    deferred so far ride in it, unless one writes the inbox (`queue.riders`)."""
    fence = statements.take_fence(session)  # the transaction's first statement: it takes the row lock too
    writes, ctes, rows = _riding(queue.riders(session))
    args = [thread_id, since, *[a for _, args in writes for a in args]]
    head = fenced = ""
    if fence is not None:
        head, fenced = f"{fence.cte(len(args) + 1)}, ", ", (SELECT count(*) FROM fence) AS fenced"
        args += fence.args
    sql = (
        f"WITH {head}{ctes}waiting AS ({queue.WAITING}), changed AS ({rows}) "  # noqa: S608 -- as `_riding`
        f"SELECT waiting.*, changed.*{fenced} FROM waiting LEFT JOIN changed ON true ORDER BY changed.position"
    )
    driver = await statements.driver(session, flush=fence is None, carries=bool(writes))
    found = await driver.fetch(sql, *args)
    if fence is not None and not found[0]["fenced"]:
        raise statements.Stale()  # the row changed since, is locked, or the lease is gone: nothing of it counts
    input_waits, effects_wait = queue.waited(session, found[0])
    read = [(statements.attach(session, tables.Message, r), r["rev"]) for r in found if r["id"] is not None]
    return read, input_waits, effects_wait


async def changed_waiting_and_taking(
    session: AsyncSession, thread_id: uuid.UUID, since: int
) -> tuple[list[tuple[tables.Message, int]], bool, bool, list[queue.Input]]:
    """`changed_and_waiting` and, unless effects wait, the input taken, in one statement (`queue.WAITING_AND_TAKING`):
    an execution's first look, from a thread that will deliver what it finds; each message taken has its place in
    the history (`queue.Input.place`). The row's lock rides in it when the transaction's first statement takes it
    (`Stale` if it did not); deferred writes ride in it as in `changed_and_waiting`."""
    fence = statements.take_fence(session)
    writes, ctes, rows = _riding(queue.riders(session))
    args = [thread_id, since, *[a for _, args in writes for a in args]]
    head = fenced = locked = ""
    if fence is not None:
        head, fenced = f"{fence.cte(len(args) + 1)}, ", ", (SELECT count(*) FROM fence) AS fenced"
        locked = " AND EXISTS (SELECT 1 FROM fence)"
        args += fence.args
    sql = (
        f"WITH {head}{ctes}{queue.WAITING_AND_TAKING.format(locked=locked)}, changed AS ({rows}) "  # noqa: S608 -- as `_riding`
        "SELECT waiting.*, places.places, taken.id AS taken_id, taken.kind AS taken_kind, "
        f"taken.payload AS taken_payload, changed.*{fenced} "
        "FROM waiting CROSS JOIN places LEFT JOIN (taken FULL JOIN changed ON false) ON true ORDER BY changed.position"
    )
    driver = await statements.driver(session, flush=False, carries=bool(writes))
    found = await driver.fetch(sql, *args)
    if fence is not None and not found[0]["fenced"]:
        raise statements.Stale()  # the row changed since the claim, is locked, or the lease is gone
    input_waits, effects_wait = queue.waited(session, found[0])
    read = [(statements.attach(session, tables.Message, r), r["rev"]) for r in found if r["id"] is not None]
    return read, input_waits, effects_wait, queue.taken(found)
