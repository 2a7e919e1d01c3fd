"""Where a tool result becomes a stored message and its log row (§7, §10): the tool hooks run on it, the message
holds what they made of it, and the `logs` row says the same — the call's arguments, how long it ran, the stored
status and error with the env's secrets masked — in the transaction that stores it, with `tool_completed`.

For the results the step loop does not record itself: subagent calls (answered at once, or by the child's result
later, `inbox.py`) and the tool calls of a subprompt step (`subprompts.py`, whose `tags` place its messages one level
deeper)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import attachments, event_types, events, logs, messages, tables
from app.engine import hooks, tools
from app.spec.definitions import Side
from app.spec.messages import ToolCall
from app.spec.results import ToolResult


async def store(
    session: AsyncSession,
    thread: tables.Thread,
    hook_runner: hooks.Hooks,
    call: ToolCall,
    result: ToolResult,
    side: Side,
    *,
    latency_ms: float | None,
    secrets: list[str],
    child: uuid.UUID | None = None,
    refs: list[dict[str, Any]] | None = None,
    tags: dict[str, Any] | None = None,
) -> tuple[ToolResult, tables.Message | None]:
    """Store a tool call's result as its `tool` message through the hooks (`after_tool_call_*`,
    `before_store_tool_result`, `before_create_message`, `after_create_message`, §10) run inside the caller's
    transaction, with the files it returned under `/attachments/` and `refs` (files already the thread's); write its
    log row and announce `tool_completed`. Returns the result as stored (as given when a hook dropped the call, which
    then leaves history) and its message. `child`: the subagent the result speaks for."""
    kept = await hook_runner.tool_result(call, result)
    tags = tags or {}
    row = None
    if kept is None:  # an `after_tool_call_*` hook removed the call and its result from history
        await messages.drop_call(session, thread.id, call["id"])
    else:
        fields: dict[str, Any] = {
            "side": side,
            "name": call["function"]["name"],
            "tool_call_id": call["id"],
            "content": kept.text,
            "tool_status": kept.status,
            "subagent_id": child,
        }
        fields["metadata_"] = dict(tags.get("metadata_") or {})
        if kept.error_code:
            fields["metadata_"].update(error_code=kept.error_code, error_data=kept.error_data)
        stored = list(refs or []) + await attachments.returned(session, thread.id, kept.attachments)
        if stored:
            fields["attachments"] = stored
        fields = hooks.tagged(await hook_runner.before_create_message("tool", fields), tags)
        placed = {"session_number": thread.session_number, **tags, **fields}  # a subprompt's: one level deeper
        row = await messages.add(session, thread.id, "tool", **placed)
        await hook_runner.after_create_message(row)
    done = kept or result
    logged = tools.log_row(thread.id, call, done, latency_ms, secrets, child=child)
    logged.message_id = row.id if row is not None else None
    await logs.add(session, logged)
    data = event_types.ToolCompleted(tool=call["function"]["name"], tool_call_id=call["id"], status=done.status)
    if tags.get("depth"):
        data["depth"] = tags["depth"]
    await events.append(session, thread.id, "tool_completed", data)
    return done, row
