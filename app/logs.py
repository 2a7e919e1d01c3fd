"""Logs: one row per LLM request, tool call log or hook error of a thread, read back a page at a time."""

from __future__ import annotations

import uuid

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app import cursors, tables


async def page(
    session: AsyncSession,
    thread_id: uuid.UUID,
    *,
    kind: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[tables.Log], str | None]:
    """A thread's logs in the order they were written, with the cursor of the next page."""
    query = select(tables.Log).where(tables.Log.thread_id == thread_id)
    if kind is not None:
        query = query.where(tables.Log.kind == kind)
    if cursor is not None:
        stamp, row_id = cursors.decode(cursor)
        query = query.where(
            or_(tables.Log.created_at > stamp, and_(tables.Log.created_at == stamp, tables.Log.id > row_id))
        )
    query = query.order_by(tables.Log.created_at, tables.Log.id).limit(limit + 1)
    rows = list((await session.execute(query)).scalars())
    next_cursor = cursors.encode(rows[limit - 1].created_at, rows[limit - 1].id) if len(rows) > limit else None
    return rows[:limit], next_cursor
