"""Threads: create, find (owner-checked), list, and the status changes clients see."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app import cursors, errors, event_types, events, statements, tables
from app.keys import Principal
from app.spec import AgentDefinition


class Status(StrEnum):
    """A thread's `status` (`threads.status`), as clients see it; each change emits `thread_status`."""

    IDLE = "idle"  # nothing to do: the next input starts a turn
    QUEUED = "queued"  # input waits for a worker to claim the thread
    RUNNING = "running"  # a worker runs its turn
    WAITING = "waiting"  # parked on a blocking subagent's session (holds no worker, never claimed)
    STOPPED = "stopped"  # stopped by its user: never claimed until continued, or posted to
    TERMINATED = "terminated"  # for good: it takes no input any more


class SessionStatus(StrEnum):
    """How a thread's current session stands (`threads.session_status`; None before its first session)."""

    RUNNING = "running"  # a turn of it is under way, or input will start the next one
    SUCCESS = "success"  # it ended well: a stop tool, stop on response, the turn cap of a `dual_ai`
    FAILURE = "failure"  # it ended badly: a fail tool, an LLM error, a crash, a step cap, a stop by the user


async def create(
    session: AsyncSession,
    agent: AgentDefinition,
    owner: Principal,
    *,
    name: str | None = None,
    tags: list[str] | None = None,
) -> tables.Thread:
    """Insert a new top-level thread."""
    thread_id = uuid.uuid4()
    row = tables.Thread(
        id=thread_id,
        agent=agent.name,
        type=agent.type,
        user_id=owner.user_id,
        name=name,
        tags=tags or [],
        root_id=thread_id,
        status=Status.IDLE,
        session_number=0,
    )
    await statements.insert(session, row)  # its server defaults read back in the same statement
    return row


async def get(session: AsyncSession, thread_id: uuid.UUID, who: Principal, *, lock: bool = False) -> tables.Thread:
    """A thread the caller may see (another user's thread is not found)."""
    sql = _GET[(who.admin, lock)]
    found = await (await statements.driver(session)).fetchrow(sql, thread_id, *(() if who.admin else (who.user_id,)))
    if found is None:
        raise errors.ThreadNotFound(f"Thread {thread_id} not found")
    row: tables.Thread = statements.attach(session, tables.Thread, found)
    return row


# GET: a thread by id, of its owner unless the caller is an admin; locked FOR NO KEY UPDATE when asked (FK checks of
# children pass), by (admin, lock).
_GET = {
    (admin, lock): "SELECT * FROM threads WHERE id = $1"  # noqa: S608 -- fixed fragments
    + ("" if admin else " AND user_id = $2")
    + (" FOR NO KEY UPDATE" if lock else "")
    for admin in (False, True)
    for lock in (False, True)
}


async def lock(session: AsyncSession, thread_id: uuid.UUID) -> tables.Thread:
    """The thread row, locked until the transaction ends (the caller checked who may see it)."""
    query = select(tables.Thread).where(tables.Thread.id == thread_id).with_for_update(key_share=True)
    row = (await session.execute(query)).scalar_one_or_none()
    if row is None:
        raise errors.ThreadNotFound(f"Thread {thread_id} not found")
    return row


async def list_(
    session: AsyncSession,
    who: Principal,
    *,
    agent: str | None = None,
    tag: str | None = None,
    parent_id: uuid.UUID | str | None = None,
    status: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[tables.Thread], str | None]:
    """Threads the caller may see, newest first, with the cursor of the next page."""
    query = select(tables.Thread)
    if not who.admin:
        query = query.where(tables.Thread.user_id == who.user_id)
    if agent is not None:
        query = query.where(tables.Thread.agent == agent)
    if tag is not None:
        query = query.where(tables.Thread.tags.contains([tag]))
    if parent_id == "none":
        query = query.where(tables.Thread.parent_id.is_(None))
    elif isinstance(parent_id, uuid.UUID):
        query = query.where(tables.Thread.parent_id == parent_id)
    if status is not None:
        query = query.where(tables.Thread.status == status)
    if cursor is not None:
        stamp, tid = cursors.decode(cursor)
        query = query.where(
            or_(
                tables.Thread.created_at < stamp,
                and_(tables.Thread.created_at == stamp, tables.Thread.id < tid),
            )
        )
    query = query.order_by(tables.Thread.created_at.desc(), tables.Thread.id.desc()).limit(limit + 1)
    rows = list((await session.execute(query)).scalars())
    next_cursor = cursors.encode(rows[limit - 1].created_at, rows[limit - 1].id) if len(rows) > limit else None
    return rows[:limit], next_cursor


async def children_counts(session: AsyncSession, ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    """How many children each thread has."""
    if not ids:
        return {}
    rows = await session.execute(
        select(tables.Thread.parent_id, func.count())
        .where(tables.Thread.parent_id.in_(ids))
        .group_by(tables.Thread.parent_id)
    )
    return {r[0]: int(r[1]) for r in rows if r[0] is not None}


# DESCENDANTS: the thread and every thread below it, deepest first (children are ended and deleted before parents).
_DESCENDANTS = """
    WITH RECURSIVE tree(id, depth) AS (
        SELECT id, 0 FROM threads WHERE id = $1
        UNION ALL
        SELECT t.id, tree.depth + 1 FROM threads t JOIN tree ON t.parent_id = tree.id
    )
    SELECT id FROM tree ORDER BY depth DESC
"""


async def descendants(session: AsyncSession, thread_id: uuid.UUID) -> list[uuid.UUID]:
    """The thread's id and those of every thread below it, deepest first."""
    return [r["id"] for r in await (await statements.driver(session)).fetch(_DESCENDANTS, thread_id)]


async def count_removal(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """Count a deletion of the thread's messages, in the transaction that deletes them: readers that keep its
    messages between transactions (the engine's `History`) then read them all again."""
    # COUNT_REMOVAL: an ORM update, so the thread row this session holds is updated as well
    await session.execute(
        update(tables.Thread)
        .where(tables.Thread.id == thread_id)
        .values(messages_removed=tables.Thread.messages_removed + 1)
    )


async def set_status(session: AsyncSession, thread: tables.Thread, status: Status) -> None:
    """Change the thread's status; a change emits `thread_status` in the same transaction."""
    if thread.status == status:
        return
    thread.status = status
    thread.updated_at = datetime.now(UTC)  # written with the row's other changes (at commit at the latest)
    await events.append(session, thread.id, "thread_status", {"status": status})


async def unpark(session: AsyncSession, thread: tables.Thread) -> None:
    """A human message ends a stop: the queued input runs again."""
    if thread.stopped:
        thread.stopped = False
        await set_status(session, thread, Status.QUEUED)


def registry_status(child: tables.Thread) -> str:
    """A child's registry status: `terminated`, the free text of its last status report, or its run state."""
    if child.terminated_at is not None:
        return "terminated"
    if child.status_text:
        return child.status_text
    if child.status in (Status.RUNNING, Status.QUEUED):
        return "running"
    if child.status == Status.WAITING:
        return "waiting"
    if child.session_status == SessionStatus.FAILURE:
        return "failed"
    return "idle"


async def end_session(
    session: AsyncSession,
    thread: tables.Thread,
    status: SessionStatus,
    reason: str,
    result: dict[str, Any] | None = None,
) -> None:
    """Record how the running session ended and emit `session_ended`; the next input starts a new session."""
    thread.session_status = status
    thread.session_reason = reason
    thread.session_result = result
    thread.side = None
    data = event_types.SessionEnded(status=status, reason=reason)
    if result is not None:
        data["result"] = result
    await events.append(session, thread.id, "session_ended", data)
