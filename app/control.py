"""Stop, continue, terminate and delete (`semantics.md` §11): parking a thread, waking it, ending it for good.

Each of them revokes the thread's lease in the transaction that changes its state, so a worker still executing it
can never write again (its next fenced commit fails), and NOTIFYs the control channel so that worker cancels the
in-flight LLM call or tool at once instead of at its next heartbeat.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app import children, effects, environment, errors, events, inputs, messages, queue, tables, threads
from app.spec.definitions import Side

CONTROL_CHANNEL = "agents_control"
# Thread rows are locked FOR NO KEY UPDATE: a child's transaction that updates its own row twice checks its
# `parent_id` foreign key with FOR KEY SHARE on the parent, which FOR UPDATE would block (and deadlock with).
NKU = {"key_share": True}
STOPPED = "Execution stopped by user"


async def _revoke(session: AsyncSession, thread: tables.Thread) -> None:
    """Take the lease away from whoever holds it and tell its worker to abandon the execution."""
    revoked = await queue.revoke(session, thread)
    await session.flush()
    if revoked is not None:  # the token names the execution to cancel, not a later one of the same thread
        await session.execute(select(func.pg_notify(CONTROL_CHANNEL, f"{thread.id}:{revoked}")))


async def close_open_work(session: AsyncSession, thread: tables.Thread, reason: str, code: str) -> None:
    """Fail the pending message (`metadata.error` `{code, message: reason}`) and answer every open tool call of the
    current session with an error."""
    rows = await messages.history(session, thread.id, session_number=thread.session_number)
    answered = {r.tool_call_id for r in rows if r.role == "tool"}
    for row in rows:
        if row.status == messages.Status.PENDING:
            await messages.save(session, row, **messages.failed(row, messages.failure(code, reason)))
        elif row.role != "tool" and row.tool_calls:
            for call in row.tool_calls:
                if call["id"] in answered:
                    continue
                await messages.add(
                    session,
                    thread.id,
                    "tool",
                    side=row.side,
                    name=call["function"]["name"],
                    tool_call_id=call["id"],
                    content=reason,
                    tool_status="error",
                    session_number=thread.session_number,
                )


async def stop(session: AsyncSession, thread: tables.Thread) -> None:
    """Abort what runs, close its open work, and park the thread until a human message or `continue`."""
    if thread.terminated_at is not None:
        raise errors.ThreadTerminated()
    if thread.stopped:
        return
    await close_open_work(session, thread, STOPPED, "stopped_by_user")
    await messages.add(session, thread.id, "system", content=STOPPED, session_number=thread.session_number)
    for child in await children.listed_by_id(session, thread.id):  # the blocking child it waits on (§11)
        if child.parent_call_id is not None and child.terminated_at is None:
            await (stop(session, child) if child.resumable else terminate(session, child))
    if thread.session_status == threads.SessionStatus.RUNNING:
        await threads.end_session(session, thread, threads.SessionStatus.FAILURE, "stopped_by_user")
        await children.report(session, thread)
    thread.stopped = True
    thread.side = None
    await _revoke(session, thread)
    await events.append(session, thread.id, "stopped_by_user", {})
    await threads.set_status(session, thread, threads.Status.STOPPED)


async def resume(session: AsyncSession, thread: tables.Thread, side: Side) -> None:
    """Clear a stop and make `side` act (the HTTP `continue`)."""
    if thread.terminated_at is not None:
        raise errors.ThreadTerminated()
    thread.stopped = False
    await queue.enqueue(session, thread.id, inputs.Kind.CONTINUE, {"side": side})
    if thread.status in (threads.Status.IDLE, threads.Status.STOPPED):
        await threads.set_status(session, thread, threads.Status.QUEUED)


async def terminate(session: AsyncSession, thread: tables.Thread, *, quiet: bool = False) -> list[uuid.UUID]:
    """End the thread and its descendants for good; later input is refused. Returns the terminated ids. `quiet`:
    the thread reports nothing to its parent (a child its parent forgets, `engine/subprompts.py`)."""
    ids = await threads.descendants(session, thread.id)
    done: list[uuid.UUID] = []
    for thread_id in ids:
        row = thread if thread_id == thread.id else await session.get(tables.Thread, thread_id, with_for_update=NKU)
        if row is None or row.terminated_at is not None:
            continue
        await close_open_work(session, row, "Thread terminated", "terminated")
        running = row.session_status == threads.SessionStatus.RUNNING
        if running:
            await threads.end_session(session, row, threads.SessionStatus.FAILURE, "terminated")
        told = running or row.parent_call_id is not None  # a waiting parent gets the failure, never silence
        if told and not (quiet and row.id == thread.id):
            await children.report(session, row, failure=children.STOPPED_EARLY.format(reason="terminated"))
        await queue.clear(session, row.id)
        await effects.cancel_all(session, row.id)
        row.terminated_at = datetime.now(UTC)
        row.stopped = False
        row.side = None
        await _revoke(session, row)
        await events.append(session, row.id, "thread_terminated", {})
        await threads.set_status(session, row, threads.Status.TERMINATED)
        done.append(row.id)
    return done


async def delete(session: AsyncSession, thread: tables.Thread) -> list[uuid.UUID]:
    """Remove the thread and its descendants, children first; running executions are abandoned at once."""
    ids = await threads.descendants(session, thread.id)
    for thread_id in ids:
        row = thread if thread_id == thread.id else await session.get(tables.Thread, thread_id, with_for_update=True)
        if row is None:
            continue
        await _revoke(session, row)
        await events.append_lifecycle(session, row, "thread_deleted")
        await environment.delete_all(session, row.id)
        await session.delete(row)
    await session.flush()
    return ids
