"""Delivery: a thread's waiting input moved into its history, per inbox kind (`semantics.md` §2).

Input is delivered only in a transaction that opens a step, so a delivery that fails rolls back nothing else: the
row is set aside (`DeliveryFailed`) and the run goes on without it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession

from app import errors, events, inputs, messages, queue, tables
from app.catalog import Catalog
from app.engine import child_tools, context, hooks, results, types
from app.engine.history import History
from app.engine.state import prepare_hooks
from app.metrics import Meter
from app.spec.definitions import AgentDefinition, Side
from app.spec.messages import ToolCall
from app.spec.results import ToolResult

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # claims of one step that ended in a crash before its session fails (`storage-and-queue.md`)


class DeliveryFailed(Exception):
    """Delivering one inbox row raised: the row is set aside so the thread does not fail on it forever."""

    def __init__(self, inbox_id: int, reason: str) -> None:
        super().__init__(reason)
        self.inbox_id = inbox_id
        self.reason = reason


@dataclass(frozen=True)
class Delivered:
    """What delivering the inbox did: between turns, the side the input makes act (§2); the turn's first message when
    its position is not known yet (its INSERT rides with the next statement, `messages.add(later=True)`: the caller
    sets `turn_start` from it once the history is read, `changes.changed` returns it); and whether the history the
    caller gave (`held`) is still current: all the delivery wrote is the messages it added to it at their places."""

    acting: Side | None = None
    starts: tables.Message | None = None
    current: bool = False


async def deliver(
    session: AsyncSession,
    thread: tables.Thread,
    agent: AgentDefinition,
    *,
    mid_turn: bool,
    catalog: Catalog,
    fernet: Fernet,
    context_: dict[str, Any],
    meter: Meter,
    taken: list[queue.Input] | None = None,
    held: History | None = None,
) -> Delivered:
    """Move the inbox into history (`taken`: what the caller already took from it, `held`: the history it read with
    it, current until this writes); a message at a place the look reserved (`queue.Input.place`) is written there,
    with the next statement, and added to `held` as written."""
    acting: Side | None = None
    first: int | tables.Message | None = None
    current = held is not None
    hook_runner = await prepare_hooks(catalog, fernet, session, thread, thread.side or "a", context=context_)
    for row in taken if taken is not None else await queue.take_inbox(session, thread.id):
        try:
            item = inputs.read(row.kind, row.payload)
            if isinstance(item, inputs.MessageInput):
                p = await hook_runner.before_delivery(item.fields())  # edits `content`, `metadata`, `silent`
                placed = {} if row.place is None else {"position": row.place}
                msg = await messages.add(
                    session,
                    thread.id,
                    item.role,
                    later=hook_runner.none,  # without hooks nothing reads it back before the history does
                    id=item.id,
                    content=p.get("content"),
                    silent=bool(p.get("silent")),
                    metadata_=p.get("metadata") or {},
                    attachments=item.attachments or [],
                    subagent_id=_uuid((p.get("metadata") or {}).get("subagent_id")),
                    session_number=thread.session_number,
                    **placed,
                )
                await hook_runner.after_create_message(msg)
                if held is not None and placed and hook_runner.none:
                    held.add(msg)
                else:
                    current = False
                first = (msg if hook_runner.none and not placed else msg.position) if first is None else first
                thread.last_message_at = msg.created_at
                if item.role == "user":
                    acting = "a"
                elif item.role == "assistant":
                    acting = "b" if agent.type == "dual_ai" else None
            elif isinstance(item, inputs.ContinueInput):
                acting = item.side
            elif isinstance(item, inputs.SpawnInput):  # a new thread's immediate subagents of side A (§6.6)
                current = False
                side_a = catalog.prompts[agent.side_a.prompt]
                env = await context.load_env(session, fernet, catalog, thread, side_a)
                await child_tools.spawn_immediate(session, catalog, fernet, thread, "a", side_a, env)
            elif isinstance(item, inputs.ChildResultInput):  # a blocking subagent call is answered (§6.4)
                current = False
                if await _answer(session, thread, item, hook_runner, catalog, fernet):
                    meter.tool_calls.labels(item.name or "", item.status).inc()
            elif isinstance(item, inputs.ToolInput):  # `state.queue_tool` outside a tool call (§7.4)
                current = False
                msg = await deliver_tool(session, thread, item.call)
                first = msg.position if first is None else first
                acting = msg.side
            else:
                current = False
        except Exception as exc:  # poison input: set aside by the engine, never retried forever
            if errors.Contention.of(exc) or errors.Unavailable.of(exc):
                raise  # the database's trouble, not the input's: the engine hands the execution back
            reason = f"input {row.kind} could not be delivered: {type(exc).__name__}: {exc}"
            raise DeliveryFailed(row.id, reason) from exc
    if mid_turn or acting is None:
        return Delivered(current=current)
    if isinstance(first, tables.Message):
        return Delivered(acting, first, current)
    thread.turn_start = first if first is not None else await messages.next_position(session, thread.id)
    return Delivered(acting, None, current)


async def set_aside_all(session: AsyncSession, thread: tables.Thread) -> None:
    """Every waiting input, kept but never delivered: one of them kills the process that delivers it."""
    reason = f"set aside: the thread's worker died {MAX_ATTEMPTS + 1} times in a row while this input waited"
    for row in await queue.set_aside_all(session, thread.id, reason):
        await events.append(session, thread.id, "error", {"code": "input_set_aside", "message": reason})
        log.warning("thread %s: input %d set aside after repeated crashes", thread.id, row.id)


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


async def _answer(
    session: AsyncSession,
    thread: tables.Thread,
    payload: inputs.ChildResultInput,
    hook_runner: hooks.Hooks,
    catalog: Catalog,
    fernet: Fernet,
) -> bool:
    """Store a blocking subagent's result as the answer of the call it kept open, as any tool result (through the
    tool hooks, with a callable's log row: the call's arguments, its duration from when it was made, the env's
    secrets masked), unless a stop answered it; whether it did."""
    if await messages.answered(session, thread.id, payload.call_id):
        return False
    text, ok = payload.content, payload.status == "success"
    result = ToolResult(status="success", result=text) if ok else types.error(text)
    holder = await messages.holding(session, thread.id, payload.call_id)
    made = next((c for c in (holder.tool_calls or [] if holder else []) if c.get("id") == payload.call_id), None)
    call = cast(ToolCall, made) if made is not None else _call(payload)
    side = thread.side or "a"
    config = catalog.agent(thread.agent).side(side)
    env = await context.load_env(session, fernet, catalog, thread, catalog.prompts[config.prompt] if config else None)
    latency_ms = None
    if payload.started_at is not None:
        latency_ms = round((datetime.now(UTC) - payload.started_at).total_seconds() * 1000, 2)
    await results.store(
        session,
        thread,
        hook_runner,
        call,
        result,
        side,
        latency_ms=latency_ms,
        secrets=env.secrets(),
        child=payload.child_id,
        refs=payload.attachments or [],
    )
    return True


def _call(payload: inputs.ChildResultInput) -> ToolCall:
    """The call a child's result answers when the message that made it is gone (deleted while the child ran)."""
    name = payload.name or ""
    return {"id": payload.call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


async def deliver_tool(session: AsyncSession, thread: tables.Thread, call: dict[str, Any]) -> tables.Message:
    """Store a queued tool call (`inputs.Kind.TOOL`) as the acting side's own call; the step loop then runs it."""
    return await messages.add(
        session,
        thread.id,
        "assistant",
        side=thread.side or "a",
        tool_calls=[call],
        session_number=thread.session_number,
    )
