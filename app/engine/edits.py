"""Edits: a client changes or deletes a stored message (`PATCH` / `DELETE /threads/{id}/messages/{message_id}`).

Both run in the caller's transaction on the locked thread row, as every write of a thread's messages does, so they
are ordered against the engine's steps: an edit takes a new revision and a deletion bumps `messages_removed`, and
the engine's next step reads either (`engine/history.py`); the request of a step already running keeps what it was
built from. What the running step still writes or uses is refused (`MessageBusy`): its `pending` answer, input not
delivered yet, and, for a deletion, the tool-call message of a step whose calls are open (its results are still to
come, and a provider refuses a tool call without its result, or a result without its call) and subprompt messages
(depth > 0) while a step is open. For the same reason a tool result is deleted only with the message that made its
call (`ToolResultAlone`). A tool's `state.update_message` and `state.delete_message` go through the same `update`
and `delete` (`engine/messages.py`).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import errors, events, messages, queue, tables, waits
from app.engine import hooks, turns


async def edit(
    session: AsyncSession, runner: hooks.Hooks, thread: tables.Thread, message_id: uuid.UUID, content: str
) -> tables.Message:
    """Replace a message's content through the acting side's update hooks (`runner`: run outside the execution,
    `state.execution` is `None`); announced as `message_data`."""
    row = await _editable(session, thread, message_id)
    return await update(session, runner, row, {"content": content})


async def update(
    session: AsyncSession, runner: hooks.Hooks, row: tables.Message, changes: dict[str, Any]
) -> tables.Message:
    """`changes` (`content`, `metadata_`) to a stored message through the `before_update_message` /
    `after_update_message` hooks, which see the message as it would be; what they leave is saved."""
    current: dict[str, Any] = {"content": row.content, "metadata_": row.metadata_, "silent": row.silent}
    updates = await runner.before_update_message(row, {**current, **changes})
    fields = {k: v for k, v in updates.items() if k in changes or v != current.get(k)}
    await messages.save(session, row, **fields)
    await runner.after_update_message(row)
    return row


async def delete(session: AsyncSession, thread: tables.Thread, message_id: uuid.UUID) -> list[uuid.UUID]:
    """Delete a message, a tool-call message with its results, or input set aside (its delivery failed); each
    announced as `message_deleted`."""
    if (aside := await _set_aside(session, thread, message_id)) is not None:  # it will never be delivered
        await queue.drop(session, aside.id)
        await events.append(session, thread.id, "message_deleted", {"message_id": str(message_id), "depth": 0})
        return [message_id]
    row = await _editable(session, thread, message_id)
    if row.role == "tool" and row.tool_call_id is not None:
        caller = await messages.holding(session, thread.id, row.tool_call_id)
        if caller is not None:
            raise errors.ToolResultAlone(
                f"Message {message_id} is the result of a tool call: delete the message that made the call "
                f"({caller.id}), and its results go with it.",
                call_message_id=str(caller.id),
            )
    if thread.step_open and row.depth > 0:  # a subprompt's traffic: the open step's calls may still use it
        raise errors.MessageBusy(
            f"Message {message_id} belongs to a subprompt of the thread's open step: try again once the step has "
            "finished."
        )
    if row.tool_calls and row.side in ("a", "b"):
        since = thread.turn_start or 0
        rows = await messages.history(session, thread.id, since=since)
        open_row, _ = turns.open_work(rows, row.side, since, thread.step_open)
        if open_row is not None and open_row.id == row.id:
            raise errors.MessageBusy(
                f"Message {message_id} made tool calls the thread's step has not finished with: try again once the "
                "step has finished."
            )
    return await messages.remove(session, thread.id, row.id)


async def _editable(session: AsyncSession, thread: tables.Thread, message_id: uuid.UUID) -> tables.Message:
    """The stored message, unless the thread is terminated or the message is still being written."""
    if thread.terminated_at is not None:
        raise errors.ThreadTerminated()
    try:
        row = await messages.get(session, thread.id, message_id)
    except errors.MessageNotFound:
        if await waits.queued(session, thread.id, message_id) is not None:
            raise errors.MessageBusy(f"Message {message_id} is queued input, not delivered yet.") from None
        raise
    if row.status == messages.Status.PENDING:
        raise errors.MessageBusy(f"Message {message_id} is still being written (`pending`).")
    return row


async def _set_aside(session: AsyncSession, thread: tables.Thread, message_id: uuid.UUID) -> tables.Inbox | None:
    """The inbox row of input whose delivery failed, if `message_id` is one (not stored, and never to be)."""
    if thread.terminated_at is not None:
        return None
    row = await waits.queued(session, thread.id, message_id)
    return row if row is not None and row.set_aside_at is not None else None
