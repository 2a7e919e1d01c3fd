"""Logs: one row per LLM request, tool call or hook run of a thread, read back a page at a time (or one by one, with
the whole request a model was sent when `LOG_REQUESTS=full` kept it).

The row of each kind is built here (`llm`, `tool`, `hook_run`, `hook_error`) and written by `add`, with the
transaction's next statement; the engine decides what goes in them (masking known secret values first).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import undefer

from app import cursors, errors, statements, tables

NAME_WIDTH = 200  # `logs.tool`'s width: a model may make up a longer name
ARGUMENTS_KEPT = 2000  # characters of a call's arguments a row keeps (after masking)


def llm(
    log_id: uuid.UUID,
    thread_id: uuid.UUID,
    message_id: uuid.UUID,
    *,
    model: str,
    provider: str,
    attempt: int,
    latency_ms: float,
    ttft_ms: float | None,
    retry_of: uuid.UUID | None,
    fallback_of: uuid.UUID | None,
    request: dict[str, Any],
    response: dict[str, Any],
    error: str | None = None,
    finish_reason: str | None = None,
    tokens: dict[str, int] | None = None,
    cost: float | None = None,
) -> tables.Log:
    """The row of one LLM request: what was asked (in brief: the engine adds the whole request as `request_full` under
    `LOG_REQUESTS=full`), what came back (an `error`, or an answer with its `tokens` by kind: `Usage.as_dict`), what
    it cost."""
    row = tables.Log(
        id=log_id,
        thread_id=thread_id,
        kind="llm",
        message_id=message_id,
        model=model,
        provider=provider,
        attempt=attempt,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
        retry_of=retry_of,
        fallback_of=fallback_of,
        request=request,
    )
    if error is not None:
        row.status, row.error = "error", error
        row.response = response
        return row
    row.status, row.finish_reason = "success", finish_reason
    if tokens is not None:
        row.input_tokens, row.output_tokens = tokens["input_tokens"], tokens["output_tokens"]
        row.cached_tokens, row.reasoning_tokens = tokens["cached_tokens"], tokens["reasoning_tokens"]
    row.cost = cost
    row.response = response
    return row


def tool(
    thread_id: uuid.UUID,
    *,
    name: object,
    call_id: str,
    status: str,
    error: str | None = None,
    latency_ms: float | None = None,
    message_id: uuid.UUID | None = None,
    arguments: tuple[str, int] | None = None,
    error_code: str | None = None,
    subagent_id: str | None = None,
) -> tables.Log:
    """The row of one tool call: its name (whatever the model sent, cut to the column), its `arguments` (masked, and
    the size of what was sent), how it ended and how long it ran; `subagent_id` for a call a child answered."""
    request: dict[str, Any] = {"tool_call_id": call_id}
    if arguments is not None:
        request.update(arguments=arguments[0][:ARGUMENTS_KEPT], arguments_bytes=arguments[1])
    if subagent_id is not None:
        request["subagent_id"] = subagent_id
    return tables.Log(
        id=uuid.uuid4(),
        thread_id=thread_id,
        kind="tool",
        message_id=message_id,
        tool=str(name)[:NAME_WIDTH],
        status=status,
        error=error,
        latency_ms=latency_ms,
        request=request,
        response={"error_code": error_code} if error_code else None,
    )


def hook_run(thread_id: uuid.UUID, *, hook: str, name: str, latency_ms: float) -> tables.Log:
    """The row of a hook that ran and returned (`hook`: which hook point, `name`: the hook's), with how long it took;
    stamped with the time it returned, on the clock messages are stamped with (`messages.add`), so that it sorts
    between the messages it ran around rather than at its transaction's start."""
    return tables.Log(
        created_at=datetime.now(UTC),
        id=uuid.uuid4(),
        thread_id=thread_id,
        kind="hook",
        tool=name,
        status="success",
        latency_ms=latency_ms,
        request={"hook": hook, "id": name},
    )


def hook_error(thread_id: uuid.UUID, *, hook: str, name: str, text: str) -> tables.Log:
    """The row of a hook that raised (`hook`: which hook point, `name`: the hook's)."""
    return tables.Log(
        id=uuid.uuid4(),
        thread_id=thread_id,
        kind="hook",
        tool=name,
        status="error",
        error=f"{hook} hook `{name}` failed: {text}",
        request={"hook": hook, "id": name},
    )


async def add(session: AsyncSession, row: tables.Log) -> None:
    """Write a row with the transaction's next statement (`statements.defer`: it rides with the events, no round trip
    of its own; nothing reads it back in the transaction that writes it)."""
    await statements.defer(session, *statements.insert_statement(row))


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


async def one(session: AsyncSession, thread_id: uuid.UUID, log_id: uuid.UUID) -> tables.Log:
    """A log of the thread, with the whole request it kept if any (`LogNotFound` if the thread has no such log)."""
    query = select(tables.Log).where(tables.Log.thread_id == thread_id, tables.Log.id == log_id)
    row = (await session.execute(query.options(undefer(tables.Log.request_full)))).scalar_one_or_none()
    if row is None:
        raise errors.LogNotFound(f"Log {log_id} not found")
    return row


async def window(
    session: AsyncSession, thread_id: uuid.UUID, *, offset: int, limit: int, descending: bool = False
) -> list[tables.Log]:
    """`limit` of the thread's logs from `offset`, in the order they were written (`state.get_logs`)."""
    log = tables.Log
    keys = (log.created_at.desc(), log.id.desc()) if descending else (log.created_at, log.id)
    query = select(log).where(log.thread_id == thread_id).order_by(*keys).offset(offset).limit(limit)
    return list((await session.execute(query)).scalars())


# REQUESTS_MADE: counted from the rows, so a worker that takes over a thread goes on where its script was; plain SQL:
# read at every request of a scripted model.
_REQUESTS_MADE = "SELECT count(*) FROM logs WHERE thread_id = $1 AND kind = 'llm' AND model = $2"


async def requests_made(session: AsyncSession, thread_id: uuid.UUID, model: str) -> int:
    """Requests a thread has made to a model: the `test` provider's durable script position."""
    return int(await (await statements.driver(session, flush=False)).fetchval(_REQUESTS_MADE, thread_id, model))


# EXPIRE: retention (`LOG_RETENTION_DAYS`, `app/retention.py`): at most `$2` rows older than `$1` seconds, found by
# `logs_created`; how many went.
_EXPIRE = """
    WITH gone AS (
        DELETE FROM logs WHERE ctid IN (
            SELECT ctid FROM logs WHERE created_at < now() - make_interval(secs => $1) LIMIT $2
        )
        RETURNING 1
    )
    SELECT count(*) FROM gone
"""


async def expire(session: AsyncSession, age_seconds: float, batch: int) -> int:
    """Delete one batch of log rows older than `age_seconds`; returns how many went."""
    return int(await (await statements.driver(session)).fetchval(_EXPIRE, float(age_seconds), batch))
