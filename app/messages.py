"""Messages: the spec's `Message` rows of a thread, each insert and update announced as `message_data`.

Every query on `messages` is here, named for what its caller needs (`holding`, `answered`, `window` ...) and
commented where it is not plain; the caller owns the transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Select, delete, func, select
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession

from app import errors, event_types, events, inputs, queue, statements, tables, threads, tracing
from app.spec.definitions import Side


class Status(StrEnum):
    """A message's `status` (`messages.status`)."""

    PENDING = "pending"  # the model's answer being written (streamed into, replaced when the call ends); or, in a
    # listing of queued input, input still waiting to be delivered
    COMPLETED = "completed"  # written in full: the history the model sees is made of these
    FAILED = "failed"  # its call failed or was interrupted (a stop); or queued input set aside (never delivered)


def failure(code: str, message: str) -> event_types.Error:
    """Why a message failed, as its `metadata.error` and the `error` event say it."""
    return {"code": code, "message": message}


def failed(row: tables.Message, error: event_types.Error) -> dict[str, Any]:
    """The fields that fail a message: its status, and `error` added to its metadata."""
    return {"status": Status.FAILED, "metadata_": {**(row.metadata_ or {}), "error": error}}


def side_of(role: str, tool_side: Side | None = None) -> Side | None:
    """The derived side: A writes `assistant`, B writes `user`, tool results follow their call."""
    if role == "assistant":
        return "a"
    if role == "user":
        return "b"
    if role == "tool":
        return tool_side
    return None


def role_of(side: Side) -> str:
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
    with session.no_autoflush:  # the engine's deferred writes stay deferred
        child = await session.get(tables.Thread, row.subagent_id)
    if child is None or child.parent_id != row.thread_id:
        return {}
    return projection(child)


def projection(child: tables.Thread) -> dict[str, Any]:
    """The `subagent_*` fields of a message that speaks for `child` (§6.5)."""
    return {
        "subagent_name": child.agent,
        "subagent_title": child.title,
        "subagent_description": child.description,
        "subagent_status": threads.registry_status(child),
        "subagent_resumable": child.resumable,
        "subagent_blocking": child.blocking,
        "subagent_thread_name": child.name,
        "subagent_spawn_group_id": str(child.spawn_group_id) if child.spawn_group_id else None,
    }


_NULLABLE = [
    a.key
    for a in sa_inspect(tables.Message).column_attrs
    if a.key not in {"position", "rev"} and a.columns[0].server_default is None and a.columns[0].nullable
]


# DEFAULTS: what the table's server defaults would give a message, for an INSERT that reads nothing back (`later`).
def _defaults() -> dict[str, Any]:
    """Every column of a new message but its `position` and `rev`, as the table's defaults would set them."""
    return {
        **dict.fromkeys(_NULLABLE),
        "status": "completed",
        "silent": False,
        "depth": 0,
        "attachments": [],
        "metadata_": {},
        "session_number": 0,
        "turn": 0,
    }


async def add(
    session: AsyncSession, thread_id: uuid.UUID, role: str, *, later: bool = False, **fields: Any
) -> tables.Message:
    """Insert a message and announce it. `later`: the INSERT goes with the transaction's next statement
    (`statements.defer`) and reads nothing back: the row's `position` and `rev` stay unloaded (the engine's history
    reads them at its next step); for a caller that uses neither before then."""
    now = datetime.now(UTC)
    fields.setdefault("side", side_of(role))
    if later:
        fields = {**_defaults(), **fields}
    ident = fields.pop("id", None) or uuid.uuid4()
    row = tables.Message(id=ident, thread_id=thread_id, role=role, created_at=now, updated_at=now, **fields)
    if later:
        sql, args = statements.insert_statement(row)
        await statements.defer(session, sql, args)
        statements.attach_new(session, row)
    else:
        await statements.insert(session, row)
    await announce(session, row)
    return row


async def save(session: AsyncSession, row: tables.Message, *, later: bool = False, **fields: Any) -> tables.Message:
    """Update a message and announce it; `later`: the UPDATE goes with the transaction's next statement
    (`statements.defer`)."""
    for key, value in fields.items():
        setattr(row, key, value)
    row.updated_at = datetime.now(UTC)
    await statements.update(session, row, (*sorted(fields), "updated_at"), later=later)
    await announce(session, row)
    return row


# PARTIAL: a streaming answer's text so far, while it is still `pending` (a stop may have failed it meanwhile) and
# while the execution that streams it holds the thread's lease (`$4`, its token; `queue.FENCE` checks the same). A
# statement of its own (`Transactions.partial`): it locks the message row and nothing else.
PARTIAL = """
    UPDATE messages SET content = $3
    WHERE id = $2 AND thread_id = $1 AND status = 'pending'
      AND EXISTS (SELECT 1 FROM leases l WHERE l.thread_id = $1 AND l.token = $4 AND l.expires_at > now())
"""


# ONE: a message by id, only if it is the thread's (ids come from clients and tools).
def _one(thread_id: uuid.UUID, message_id: uuid.UUID) -> Select[tables.Message]:
    return select(tables.Message).where(tables.Message.thread_id == thread_id, tables.Message.id == message_id)


async def get(session: AsyncSession, thread_id: uuid.UUID, message_id: uuid.UUID) -> tables.Message:
    """A message of the thread, or `MessageNotFound`."""
    row = (await session.execute(_one(thread_id, message_id))).scalar_one_or_none()
    if row is None:
        raise errors.MessageNotFound(f"Message {message_id} not found")
    return row


# RESULTS_OF: the `tool` messages answering calls `call_ids`: they are deleted with the message that made the calls
# (a provider refuses a result without its call).
def _results_of(thread_id: uuid.UUID, call_ids: list[str]) -> Select[uuid.UUID, int]:
    return select(tables.Message.id, tables.Message.depth).where(
        tables.Message.thread_id == thread_id,
        tables.Message.role == "tool",
        tables.Message.tool_call_id.in_(call_ids),
    )


async def remove(session: AsyncSession, thread_id: uuid.UUID, message_id: uuid.UUID) -> list[uuid.UUID]:
    """Delete a message, and a tool-call message's results with it; returns the ids deleted (none if not found).
    Each deleted message is announced as `message_deleted`."""
    row = (await session.execute(_one(thread_id, message_id))).scalar_one_or_none()
    if row is None:
        return []
    gone = [(row.id, row.depth)]
    call_ids = [c["id"] for c in row.tool_calls or []]
    if call_ids:
        gone += [(r.id, r.depth) for r in await session.execute(_results_of(thread_id, call_ids))]
    ids = [i for i, _ in gone]
    await session.execute(delete(tables.Message).where(tables.Message.id.in_(ids)))
    await threads.count_removal(session, thread_id)
    for gone_id, depth in gone:
        await events.append(session, thread_id, "message_deleted", {"message_id": str(gone_id), "depth": depth})
    return ids


# HOLDING: the messages whose `tool_calls` hold call `call_id`, newest first (call ids are the model's, so the newest
# one holding it is the call a result or a queued call belongs to).
def _holding(thread_id: uuid.UUID, call_id: str) -> Select[tables.Message]:
    return (
        select(tables.Message)
        .where(tables.Message.thread_id == thread_id, tables.Message.tool_calls.contains([{"id": call_id}]))
        .order_by(tables.Message.position.desc())
    )


async def holding(
    session: AsyncSession, thread_id: uuid.UUID, call_id: str, *, role: str | None = None
) -> tables.Message | None:
    """The message that made tool call `call_id` (with `role` only, when given), if it is still there."""
    query = _holding(thread_id, call_id)
    if role is not None:
        query = query.where(tables.Message.role == role)
    return (await session.execute(query.limit(1))).scalar_one_or_none()


async def drop_call(session: AsyncSession, thread_id: uuid.UUID, call_id: str) -> None:
    """Remove a tool call from the stored assistant message that made it, so history stays paired."""
    query = _holding(thread_id, call_id).where(tables.Message.role == "assistant")
    for row in (await session.execute(query)).scalars():
        kept = [c for c in row.tool_calls or [] if c["id"] != call_id]
        await save(session, row, tool_calls=kept or None)


# ANSWERED: a `tool` message answering call `call_id` (a stop may have answered the call before its result came).
def _answered(thread_id: uuid.UUID, call_id: str) -> Select[uuid.UUID]:
    return select(tables.Message.id).where(
        tables.Message.thread_id == thread_id, tables.Message.tool_call_id == call_id
    )


async def answered(session: AsyncSession, thread_id: uuid.UUID, call_id: str) -> bool:
    """Whether tool call `call_id` has its result message."""
    return (await session.execute(_answered(thread_id, call_id))).first() is not None


# RUNS: the messages of subprompt call `call_id` that runs other than `run` stored (each is tagged with its call and
# run by `engine/subprompts.py`): an interrupted execution's, whose answer nobody will read.
def _runs(thread_id: uuid.UUID, call_id: str, run: str) -> Select[uuid.UUID]:
    message = tables.Message
    return select(message.id).where(
        message.thread_id == thread_id,
        message.depth > 0,
        message.metadata_["subprompt_call"].astext == call_id,
        message.metadata_["subprompt_run"].astext != run,
    )


# NESTED: the messages one level below `parents` (nested runs' traffic), read level by level.
def _nested(thread_id: uuid.UUID, parents: list[uuid.UUID]) -> Select[uuid.UUID]:
    return select(tables.Message.id).where(tables.Message.thread_id == thread_id, tables.Message.parent_id.in_(parents))


# REACHED: the children the tool results among `ids` speak for, with the tool that reached each.
def _reached(ids: list[uuid.UUID]) -> Select[uuid.UUID | None, str | None]:
    message = tables.Message
    return select(message.subagent_id, message.name).where(
        message.id.in_(ids), message.role == "tool", message.subagent_id.is_not(None)
    )


@dataclass(frozen=True)
class Forgotten:
    """What `forget_runs` deleted: how many messages, and the children their tool results spoke for (each with the
    tool that reached it)."""

    count: int
    reached: dict[uuid.UUID, str | None]


async def forget_runs(session: AsyncSession, thread_id: uuid.UUID, call_id: str, run: str) -> Forgotten:
    """Delete what runs of subprompt call `call_id` by other executions stored, with their nested runs' messages."""
    found = list((await session.execute(_runs(thread_id, call_id, run))).scalars())
    frontier = found
    while frontier:
        frontier = list((await session.execute(_nested(thread_id, frontier))).scalars())
        found += frontier
    if not found:
        return Forgotten(0, {})
    reached = {child: name for child, name in await session.execute(_reached(found)) if child is not None}
    await session.execute(delete(tables.Message).where(tables.Message.id.in_(found)))
    return Forgotten(len(found), reached)


# SPEAKING_FOR: the messages that speak for these children (their reports, `notify_parent`), `subagent_id` naming one.
def _speaking_for(thread_id: uuid.UUID, children: list[uuid.UUID]) -> Select[uuid.UUID]:
    message = tables.Message
    return (
        select(message.id)
        .where(message.thread_id == thread_id, message.subagent_id.in_(children))
        .order_by(message.position)
    )


async def speaking_for(session: AsyncSession, thread_id: uuid.UUID, children: list[uuid.UUID]) -> list[uuid.UUID]:
    """The ids of the thread's messages that speak for these children, oldest first."""
    return list((await session.execute(_speaking_for(thread_id, children))).scalars())


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
    queued = {
        "id": str(message_id),
        "role": role,
        "content": content,
        "silent": silent,
        "metadata": metadata or {},
        "attachments": attachments or [],
        "queued_at": datetime.now(UTC).isoformat(),
    }
    if (trace := tracing.carrier()) is not None:  # the execution that delivers it continues this trace
        queued[tracing.CARRIER] = trace
    return message_id, queued


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
    if thread.terminated_at is not None:
        raise errors.ThreadTerminated()
    message_id, queued = payload(role, content, silent=silent, metadata=metadata, attachments=attachments)
    if not posted:
        await queue.enqueue(session, thread.id, inputs.Kind.MESSAGE, queued)
    else:
        await queue.enqueue_alongside(session, thread.id, inputs.Kind.MESSAGE, queued)
        if role != "system":
            await threads.unpark(session, thread)
    if thread.status == threads.Status.IDLE:
        await threads.set_status(session, thread, threads.Status.QUEUED)
    return message_id


async def history(
    session: AsyncSession, thread_id: uuid.UUID, *, session_number: int | None = None, since: int | None = None
) -> list[tables.Message]:
    """The history of a thread in order (the engine's view), or of one of its sessions, or from position `since`."""
    query = select(tables.Message).where(tables.Message.thread_id == thread_id).order_by(tables.Message.position)
    if session_number is not None:
        query = query.where(tables.Message.session_number == session_number)
    if since is not None:
        query = query.where(tables.Message.position >= since)
    return list((await session.execute(query)).scalars())


async def last_position(session: AsyncSession, thread_id: uuid.UUID, side: str) -> int | None:
    """The position of the side's last top-level message other than a tool result (the input a turn answers)."""
    query = select(func.max(tables.Message.position)).where(
        tables.Message.thread_id == thread_id,
        tables.Message.side == side,
        tables.Message.role != "tool",
        tables.Message.depth == 0,
    )
    found = (await session.execute(query)).scalar_one_or_none()
    return int(found) if found is not None else None


async def next_position(session: AsyncSession, thread_id: uuid.UUID) -> int:
    """A position after every message of the thread (a turn that starts without new input)."""
    query = select(func.coalesce(func.max(tables.Message.position), 0) + 1).where(tables.Message.thread_id == thread_id)
    return int((await session.execute(query)).scalar_one())


async def window(
    session: AsyncSession,
    thread_id: uuid.UUID,
    *,
    offset: int,
    limit: int,
    descending: bool = False,
    include_silent: bool = False,
    max_depth: int = 0,
) -> tuple[list[tables.Message], int]:
    """`limit` messages from `offset` in position order (`state.get_messages`), and how many there are in all."""
    cond = [tables.Message.thread_id == thread_id, tables.Message.depth <= max_depth]
    if not include_silent:
        cond.append(tables.Message.silent.is_(False))
    total = int((await session.execute(select(func.count()).where(*cond))).scalar_one())
    position = tables.Message.position
    query = (
        select(tables.Message)
        .where(*cond)
        .order_by(position.desc() if descending else position.asc())
        .offset(offset)
        .limit(limit)
    )
    return list((await session.execute(query)).scalars()), total


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
