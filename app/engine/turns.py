"""Turns and sessions: who acts, where a turn starts, what a crash left unfinished, how a turn ends (`semantics.md`
§1–§5)."""

from __future__ import annotations

import uuid

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession

from app import children, events, messages, tables, threads
from app.engine import stops, types
from app.spec.definitions import AgentDefinition, Side, SideConfig
from app.spec.messages import ToolCall


def start(thread: tables.Thread, acting: Side) -> None:
    """Begin the acting side's turn, and a new session if none is running."""
    if thread.session_number == 0 or thread.session_status != threads.SessionStatus.RUNNING:
        thread.session_number += 1
        thread.session_turns = 0
        thread.session_steps = 0
        thread.session_status = threads.SessionStatus.RUNNING
        thread.session_reason = None
        thread.session_result = None
    thread.side = acting
    thread.turn_steps = 0


async def after(session: AsyncSession, thread: tables.Thread, agent: AgentDefinition, side: Side) -> bool:
    """`ai_human`: wait for the human. `dual_ai`: the other side acts next, in this execution."""
    if agent.type == "dual_ai":
        start(thread, "b" if side == "a" else "a")
        thread.turn_start = await answered_position(session, thread.id, side)
        return True
    thread.side = None
    await threads.set_status(session, thread, threads.Status.IDLE)
    return False


async def end_session(session: AsyncSession, thread: tables.Thread, verdict: types.Verdict) -> None:
    assert verdict.status is not None and verdict.reason is not None
    await threads.end_session(session, thread, verdict.status, verdict.reason, verdict.result)
    await threads.set_status(session, thread, threads.Status.IDLE)
    await children.report(session, thread)  # a child hands its result to its parent in this transaction


async def report_status(
    session: AsyncSession, thread: tables.Thread, side: SideConfig, outcomes: list[types.Outcome]
) -> None:
    """A successful `sessionStatus` call sets the thread's status text, and a child's entry in its parent's registry
    (`subagent_status` on the parent's stream); it never stops anything (§5)."""
    binding = side.binding("status")
    for outcome in outcomes:
        if binding is None or outcome.call["function"]["name"] != binding.name:
            continue
        if outcome.result.status == "success":
            thread.status_text = stops.payload(binding, outcome)["content"]
            await events.append(
                session, thread.id, "thread_status", {"status": thread.status, "status_text": thread.status_text}
            )
            await children.announce(session, thread)


async def answered_position(session: AsyncSession, thread_id: uuid.UUID, side: Side) -> int:
    """Where the next turn starts: the ending side's last message, the input the other side answers (§1)."""
    found = await messages.last_position(session, thread_id, side)
    return found if found is not None else await messages.next_position(session, thread_id)


async def in_progress(session: AsyncSession, thread: tables.Thread) -> bool:
    """Whether a turn was left unfinished: a step opened in it, or open work (a pending message, unanswered tool
    calls) waits in it. Read from what is stored, never from what delivering new input would change."""
    if thread.session_status != threads.SessionStatus.RUNNING or thread.side is None:
        return False
    if thread.turn_steps > 0 or thread.step_open:
        return True
    rows = await messages.history(session, thread.id, session_number=thread.session_number)
    return open_work(rows, thread.side, thread.turn_start or 0, step_open=False)[0] is not None


def open_work(
    rows: list[tables.Message], side: Side, turn_start: int, step_open: bool
) -> tuple[tables.Message | None, list[ToolCall]]:
    """The acting side's unfinished step in this turn: a `pending` message (its call was interrupted), or a message
    whose tool calls are not all answered (with those calls), or — while the step's stops are not evaluated yet —
    the model's last answer, the one that made calls (a hook may have dropped them all from it since, §10). Input
    delivered after it (mid-turn messages) does not hide it."""
    answered = {r.tool_call_id for r in rows if r.role == "tool"}
    calling: tables.Message | None = None
    for row in reversed(rows):
        if row.role == "tool" or row.side != side or row.depth != 0 or row.position < turn_start:
            continue
        if row.status == messages.Status.PENDING:
            return row, []
        if row.status == messages.Status.COMPLETED and row.tool_calls:
            missing = [c for c in row.tool_calls if c["id"] not in answered]
            if missing:
                return row, missing
        if row.status == messages.Status.COMPLETED and (row.tool_calls or row.prompt is not None):
            calling = calling or row
    return (calling, []) if step_open and calling is not None else (None, [])


def attach_committed(session: AsyncSession, row: tables.Message | None) -> tables.Message | None:
    """A row committed by an earlier transaction of this execution, added to `session` as it was committed (nobody
    else writes the thread's messages while the lease holds), or None when it is not usable as it is."""
    if row is None:
        return None
    state = sa_inspect(row)
    # still in another session, or rolled back since (a row inserted `later` never loaded its `position` and `rev`)
    if not state.detached or state.expired_attributes - {"position", "rev"}:
        return None
    session.add(row)
    return row
