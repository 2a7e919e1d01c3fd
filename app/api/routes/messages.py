"""Messages: post input to a thread's inbox, read its history."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from sqlalchemy.ext.asyncio import AsyncSession

from app import errors, lifecycle, messages, queue, tables, threads
from app.api import schemas
from app.api.deps import CurrentUser, SessionDep

router = APIRouter(tags=["messages"])

ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": schemas.Error}, 404: {"model": schemas.Error}}


async def enqueue_message(session: AsyncSession, thread: tables.Thread, body: schemas.MessageIn) -> uuid.UUID:
    """Queue a message for delivery; the thread runs it when a worker claims it (§2)."""
    if thread.terminated_at is not None:
        raise errors.ThreadTerminated()
    if body.attachments:
        raise errors.Invalid("Attachments are not supported by this server version yet; send text content only.")
    message_id = uuid.uuid4()
    payload = {
        "id": str(message_id),
        "role": body.role,
        "content": body.content,
        "silent": body.silent,
        "metadata": body.metadata,
        "queued_at": datetime.now(UTC).isoformat(),
    }
    await queue.enqueue(session, thread.id, queue.Kind.MESSAGE, payload)
    if body.role != "system":
        await lifecycle.unpark(session, thread)
    if thread.status == "idle":
        await threads.set_status(session, thread, "queued")
    return message_id


@router.post(
    "/threads/{thread_id}/messages",
    status_code=202,
    responses={**ERRORS, 409: {"model": schemas.Error}, 415: {"model": schemas.Error}},
)
async def post_message(
    thread_id: uuid.UUID, body: schemas.MessageIn, session: SessionDep, who: CurrentUser
) -> schemas.Queued:
    """Queue a message; a `user` message makes side A act."""
    thread = await threads.get(session, thread_id, who, lock=True)
    message_id = await enqueue_message(session, thread, body)
    await session.commit()
    return schemas.Queued(message_id=message_id)


def _queued(row: tables.Inbox) -> schemas.Message:
    p = row.payload
    return schemas.Message(
        id=uuid.UUID(p["id"]),
        role=p["role"],
        side=messages.side_of(p["role"]),
        content=p.get("content"),
        name=None,
        tool_calls=None,
        tool_call_id=None,
        tool_status=None,
        status="pending",
        silent=bool(p.get("silent")),
        depth=0,
        parent_id=None,
        attachments=[],
        reasoning_content=None,
        metadata={**(p.get("metadata") or {}), "queued": True},
        subagent_id=None,
        model=None,
        usage=None,
        created_at=row.created_at,
    )


@router.get("/threads/{thread_id}/messages", responses=ERRORS)
async def list_messages(
    thread_id: uuid.UUID,
    session: SessionDep,
    who: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
    order: Literal["asc", "desc"] = "asc",
    include_silent: bool = False,
    depth: Annotated[int, Query(ge=0, le=100)] = 0,
    since_id: uuid.UUID | None = None,
) -> schemas.MessageList:
    """A page of history (newest page first, older pages through `cursor`), plus queued input."""
    thread = await threads.get(session, thread_id, who)
    rows, next_cursor = await messages.page(
        session,
        thread.id,
        limit=limit,
        cursor=cursor,
        order=order,
        include_silent=include_silent,
        depth=depth,
        since_id=since_id,
    )
    out = [schemas.Message.model_validate(messages.to_dict(r)) for r in rows]
    if cursor is None:
        queued = [
            _queued(r)
            for r in await queue.pending(session, thread.id)
            if r.kind == queue.Kind.MESSAGE and (include_silent or not r.payload.get("silent"))
        ]
        out = out + queued if order == "asc" else queued[::-1] + out
    return schemas.MessageList(messages=out, next_cursor=next_cursor)


@router.get("/threads/{thread_id}/messages/{message_id}", responses=ERRORS)
async def get_message(
    thread_id: uuid.UUID, message_id: uuid.UUID, session: SessionDep, who: CurrentUser
) -> schemas.Message:
    """One message."""
    thread = await threads.get(session, thread_id, who)
    return schemas.Message.model_validate(messages.to_dict(await messages.get(session, thread.id, message_id)))
