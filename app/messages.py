"""Messages: the spec's `Message` rows of a thread, each insert and update announced as `message_data`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app import db, errors, events, queue, tables, threads


def side_of(role: str, tool_side: str | None = None) -> str | None:
    """The derived side: A writes `assistant`, B writes `user`, tool results follow their call."""
    if role == "assistant":
        return "a"
    if role == "user":
        return "b"
    if role == "tool":
        return tool_side
    return None


def role_of(side: str) -> str:
    """The stored role of what a side writes: roles record authorship (§1)."""
    return "assistant" if side == "a" else "user"


def to_dict(row: tables.Message) -> dict[str, Any]:
    """The API's `Message`."""
    return {
        "id": str(row.id),
        "role": row.role,
        "side": row.side,
        "content": row.content,
        "name": row.name,
        "tool_calls": row.tool_calls,
        "tool_call_id": row.tool_call_id,
        "tool_status": row.tool_status,
        "status": row.status,
        "silent": row.silent,
        "depth": row.depth,
        "parent_id": str(row.parent_id) if row.parent_id else None,
        "attachments": row.attachments,
        "reasoning_content": row.reasoning_content,
        "metadata": row.metadata_,
        "subagent_id": str(row.subagent_id) if row.subagent_id else None,
        "model": row.model,
        "usage": row.usage,
        "created_at": row.created_at.isoformat(),
    }


async def announce(session: AsyncSession, row: tables.Message) -> None:
    """Emit `message_data` for the row as it is now, with the `subagent_*` fields `GET /messages` has."""
    data = to_dict(row)
    if row.subagent_id is not None:
        data.update(await _projected(session, row))
    await events.append(
        session, row.thread_id, "message_data", {"message_id": str(row.id), "depth": row.depth, "data": data}
    )


async def _projected(session: AsyncSession, row: tables.Message) -> dict[str, Any]:
    """The `subagent_*` fields of a message that speaks for a child of its thread (§6.5). The child comes from the
    session when it holds it (a subagent call's own transaction: no SQL), else by its key."""
    from app import children  # it builds on this module

    with session.no_autoflush:  # the engine's deferred writes stay deferred
        child = await session.get(tables.Thread, row.subagent_id)
    if child is None or child.parent_id != row.thread_id:
        return {}
    return children.projection(child)


async def add(session: AsyncSession, thread_id: uuid.UUID, role: str, **fields: Any) -> tables.Message:
    """Insert a message and announce it."""
    now = datetime.now(UTC)
    row = tables.Message(
        id=fields.pop("id", None) or uuid.uuid4(),
        thread_id=thread_id,
        role=role,
        created_at=now,
        updated_at=now,
        side=fields.pop("side", side_of(role)),
        **fields,
    )
    await db.insert(session, row)
    await announce(session, row)
    return row


async def save(session: AsyncSession, row: tables.Message, *, later: bool = False, **fields: Any) -> tables.Message:
    """Update a message and announce it; `later`: the UPDATE goes with the transaction's next statement (`db.defer`)."""
    for key, value in fields.items():
        setattr(row, key, value)
    row.updated_at = datetime.now(UTC)
    await db.update(session, row, (*sorted(fields), "updated_at"), later=later)
    await announce(session, row)
    return row


async def get(session: AsyncSession, thread_id: uuid.UUID, message_id: uuid.UUID) -> tables.Message:
    row = (
        await session.execute(
            select(tables.Message).where(tables.Message.thread_id == thread_id, tables.Message.id == message_id)
        )
    ).scalar_one_or_none()
    if row is None:
        raise errors.MessageNotFound(f"Message {message_id} not found")
    return row


async def remove(session: AsyncSession, thread_id: uuid.UUID, message_id: uuid.UUID) -> list[uuid.UUID]:
    """Delete a message, and a tool-call message's results with it; returns the ids deleted (none if not found).
    Each deleted message is announced as `message_deleted`."""
    row = (
        await session.execute(
            select(tables.Message).where(tables.Message.thread_id == thread_id, tables.Message.id == message_id)
        )
    ).scalar_one_or_none()
    if row is None:
        return []
    gone = [(row.id, row.depth)]
    call_ids = [c["id"] for c in row.tool_calls or []]
    if call_ids:
        results = select(tables.Message.id, tables.Message.depth).where(
            tables.Message.thread_id == thread_id,
            tables.Message.role == "tool",
            tables.Message.tool_call_id.in_(call_ids),
        )
        gone += [(r.id, r.depth) for r in await session.execute(results)]
    ids = [i for i, _ in gone]
    await session.execute(delete(tables.Message).where(tables.Message.id.in_(ids)))
    # REMOVED: tell readers that keep a thread's messages between transactions (the engine) to read them all again
    await session.execute(
        update(tables.Thread)
        .where(tables.Thread.id == thread_id)
        .values(messages_removed=tables.Thread.messages_removed + 1)
    )
    for gone_id, depth in gone:
        await events.append(session, thread_id, "message_deleted", {"message_id": str(gone_id), "depth": depth})
    return ids


def payload(
    role: str,
    content: str | None,
    *,
    silent: bool = False,
    metadata: dict[str, Any] | None = None,
    attachments: list[dict[str, Any]] | None = None,
) -> tuple[uuid.UUID, dict[str, Any]]:
    """A new message's id, and the inbox payload that queues it (`enqueue`, or `queue.post` in one statement)."""
    message_id = uuid.uuid4()
    return message_id, {
        "id": str(message_id),
        "role": role,
        "content": content,
        "silent": silent,
        "metadata": metadata or {},
        "attachments": attachments or [],
        "queued_at": datetime.now(UTC).isoformat(),
    }


async def enqueue(
    session: AsyncSession,
    thread: tables.Thread,
    role: str,
    content: str | None,
    *,
    silent: bool = False,
    metadata: dict[str, Any] | None = None,
    attachments: list[dict[str, Any]] | None = None,
    posted: bool = False,
) -> uuid.UUID:
    """Queue a message for delivery (§2) and return the id it will be stored with; the thread row is locked.
    A `metadata.subagent_id` is kept on the stored message (the child it speaks for). `posted`: a client's message
    (the API), which ends a stop unless it is a `system` one, and whose inbox row goes with the events the
    transaction holds (`queue.enqueue_alongside`)."""
    from app import control  # it builds on this module

    if thread.terminated_at is not None:
        raise errors.ThreadTerminated()
    message_id, queued = payload(role, content, silent=silent, metadata=metadata, attachments=attachments)
    if not posted:
        await queue.enqueue(session, thread.id, queue.Kind.MESSAGE, queued)
    else:
        await queue.enqueue_alongside(session, thread.id, queue.Kind.MESSAGE, queued)
        if role != "system":
            await control.unpark(session, thread)
    if thread.status == "idle":
        await threads.set_status(session, thread, "queued")
    return message_id


async def history(
    session: AsyncSession, thread_id: uuid.UUID, *, session_number: int | None = None
) -> list[tables.Message]:
    """The history of a thread in order (the engine's view), or of one of its sessions."""
    query = select(tables.Message).where(tables.Message.thread_id == thread_id).order_by(tables.Message.position)
    if session_number is not None:
        query = query.where(tables.Message.session_number == session_number)
    return list((await session.execute(query)).scalars())


# CHANGED: a thread's messages inserted or updated after revision `since`, with their revision now. Every write of a
# thread's messages happens under its thread row lock (a fenced engine transaction, or a lifecycle change that locks
# the row), and each takes its revision from one sequence while holding it, so a reader holding the lock that saw
# revision N has seen every row written at or below N: rows above N are exactly those written since.
_CHANGED = "SELECT * FROM messages WHERE thread_id = $1 AND rev > $2 ORDER BY position"


async def changed(session: AsyncSession, thread_id: uuid.UUID, since: int) -> list[tuple[tables.Message, int]]:
    """The thread's messages written after revision `since`, in order, each with its current revision (read at every
    step: in plain SQL; rows the session holds are refreshed, as `populate_existing` would)."""
    found = await (await db.driver(session)).fetch(_CHANGED, thread_id, since)
    return [(db.attach(session, tables.Message, row), row["rev"]) for row in found]


async def page(
    session: AsyncSession,
    thread_id: uuid.UUID,
    *,
    limit: int = 50,
    cursor: str | None = None,
    order: str = "asc",
    include_silent: bool = False,
    depth: int = 0,
    since_id: uuid.UUID | None = None,
) -> tuple[list[tables.Message], str | None]:
    """A page of messages. Without `since_id` it is the newest `limit` (older ones through `cursor`);
    with `since_id`, the ones after that message. Rows come back in `order`."""
    query = select(tables.Message).where(tables.Message.thread_id == thread_id, tables.Message.depth <= depth)
    if not include_silent:
        query = query.where(tables.Message.silent.is_(False))
    if since_id is not None:
        anchor = await get(session, thread_id, since_id)
        query = query.where(tables.Message.position > anchor.position).order_by(tables.Message.position)
    else:
        if cursor is not None:
            try:
                before = int(cursor)
            except ValueError as exc:
                raise errors.BadCursor() from exc
            if not 0 < before < 2**62:
                raise errors.BadCursor()
            query = query.where(tables.Message.position < before)
        query = query.order_by(tables.Message.position.desc())
    rows = list((await session.execute(query.limit(limit + 1))).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more and since_id is None:
        next_cursor = str(rows[-1].position)
    rows.sort(key=lambda r: r.position, reverse=order == "desc")
    return rows, next_cursor


async def of_turn(
    session: AsyncSession, thread_id: uuid.UUID, ids: list[uuid.UUID], first: uuid.UUID
) -> list[tables.Message]:
    """The messages `ids` of a thread as they are now, in order, without silent ones but `first` (the input)."""
    query = (
        select(tables.Message)
        .where(tables.Message.thread_id == thread_id, tables.Message.id.in_(ids))
        .where(tables.Message.silent.is_(False) | (tables.Message.id == first))
        .order_by(tables.Message.position)
    )
    return list((await session.execute(query)).scalars())
