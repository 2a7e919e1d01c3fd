"""Where a tool result becomes a stored message and its log row (§7, §10): the tool hooks run on it, the message
holds what they made of it, and the `logs` row says the same — the call's arguments, how long it ran, the stored
status and error with the env's secrets masked — in the transaction that stores it, with `tool_completed`.

Every path goes through here: the step's callables (`tool_phase.py`: `shape` between its transactions, `write` in
the one that records the call), subagent calls (answered at once, or by the child's result later, `inbox.py`) and the
tool calls of a subprompt step (`subprompts.py`, whose `tags` place its messages one level deeper): `store` does both
inside the caller's transaction."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import attachments, event_types, events, logs, messages, tables
from app.engine import hooks, tools
from app.spec.definitions import Side
from app.spec.messages import ToolCall
from app.spec.results import ToolResult


@dataclass(frozen=True)
class Shaped:
    """A tool result as its hooks left it: what is stored (as given when a hook dropped the call), the fields of its
    `tool` message (None: the call and its result leave history) and its log row."""

    result: ToolResult
    fields: dict[str, Any] | None
    logged: tables.Log
    depth: int = 0  # a subprompt's call: how deep its messages sit (its events say so)
    hooks_ran: tuple[tables.Log, ...] = ()  # the rows of its hooks that returned, run outside a transaction


Files = Callable[[ToolResult], Awaitable[list[dict[str, Any]]]]  # the references of the files a result returned


async def shape(
    hook_runner: hooks.Hooks,
    thread_id: uuid.UUID,
    call: ToolCall,
    result: ToolResult,
    side: Side,
    *,
    latency_ms: float | None,
    secrets: list[str],
    files: Files,
    child: uuid.UUID | None = None,
    refs: list[dict[str, Any]] | None = None,
    tags: dict[str, Any] | None = None,
) -> Shaped:
    """Run the tool hooks on a call's result (`after_tool_call_*`, `before_store_tool_result`, then
    `before_create_message` on its message, §10) and build its message and log row — the call's arguments, how long
    it ran, the stored status and error with `secrets` masked. `files` stores what the result returned under
    `/attachments/`; `refs` are files already the thread's; `child`: the subagent the result speaks for."""
    tags = tags or {}
    with hooks.kept() as ran:  # the rows of hooks run outside a transaction: written with the result's
        kept = await hook_runner.tool_result(call, result)
        fields: dict[str, Any] | None = None
        if kept is not None:
            fields = {
                "side": side,
                "name": call["function"]["name"],
                "tool_call_id": call["id"],
                "content": kept.text,
                "tool_status": kept.status,
                "subagent_id": child,
                "metadata_": dict(tags.get("metadata_") or {}),
            }
            if kept.error_code:
                fields["metadata_"].update(error_code=kept.error_code, error_data=kept.error_data)
            stored = list(refs or []) + await files(kept)
            if stored:
                fields["attachments"] = stored
            fields = {**tags, **hooks.tagged(await hook_runner.before_create_message("tool", fields), tags)}
    done = kept or result
    logged = tools.log_row(thread_id, call, done, latency_ms, secrets, child=child)
    return Shaped(done, fields, logged, tags.get("depth") or 0, tuple(r.row(thread_id) for r in ran))


async def write(
    session: AsyncSession,
    thread: tables.Thread,
    call: ToolCall,
    shaped: Shaped,
    *,
    created: Callable[[tables.Message], Awaitable[None]] | None = None,
    later: bool = False,
) -> tables.Message | None:
    """In the caller's transaction: the call's `tool` message (or the call dropped from history), its log row and
    `tool_completed`. `created` runs on the new message before the rest (the `after_create_message` hooks of a
    result stored inside one transaction). `later`: nothing reads the message back before the commit, so its INSERT
    rides with the transaction's next statement (`messages.add`)."""
    row = None
    if shaped.fields is None:
        await messages.drop_call(session, thread.id, call["id"])
    else:
        row = await messages.add(
            session,
            thread.id,
            "tool",
            later=later and created is None,
            **{"session_number": thread.session_number, **shaped.fields},
        )
        if created is not None:
            await created(row)
    shaped.logged.message_id = row.id if row is not None else None
    for ran in shaped.hooks_ran:
        await logs.add(session, ran)
    await logs.add(session, shaped.logged)  # rides with the transaction's events
    data = event_types.ToolCompleted(
        tool=call["function"]["name"], tool_call_id=call["id"], status=shaped.result.status
    )
    if shaped.depth:
        data["depth"] = shaped.depth
    await events.append(session, thread.id, "tool_completed", data)
    return row


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
    """`shape` and `write` inside the caller's transaction, its hooks joining it; the result as stored and its
    message."""

    async def returned(kept: ToolResult) -> list[dict[str, Any]]:
        return await attachments.returned(session, thread.id, kept.attachments)

    shaped = await shape(
        hook_runner,
        thread.id,
        call,
        result,
        side,
        latency_ms=latency_ms,
        secrets=secrets,
        files=returned,
        child=child,
        refs=refs,
        tags=tags,
    )
    row = await write(session, thread, call, shaped, created=hook_runner.after_create_message)
    return shaped.result, row
