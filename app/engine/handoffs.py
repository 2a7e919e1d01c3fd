"""Handoffs (`semantics.md` §7.3): an `ai_human` agent hands its thread to another `ai_human` agent.

The thread keeps its id, history and files; only its agent changes (the first agent stays in `origin_agent`), and
the new agent's side A takes a new turn at once, in the same run. A handoff is not a turn.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app import events, tables
from app.catalog import Catalog
from app.engine import types
from app.spec.results import ToolResult

RESULT = "Handoff complete"


async def switch(session: AsyncSession, thread: tables.Thread, catalog: Catalog, target: str) -> ToolResult:
    """Give the thread to agent `target`: the one place a thread changes agent (the place to re-arm the new
    prompt's immediate subagents, §6.6)."""
    current = catalog.agent(thread.agent)
    agent = catalog.agents.get(target)
    if current.type != "ai_human" or agent is None or agent.type != "ai_human":
        text = f"Cannot hand off to `{target}`: handoffs go from an ai_human agent to another ai_human agent"
        return types.error(text)
    previous = thread.agent
    thread.origin_agent = thread.origin_agent or previous
    thread.agent = target
    thread.updated_at = datetime.now(UTC)
    await session.flush()
    await events.append(session, thread.id, "agent_handoff", {"from_agent": previous, "to_agent": target})
    await events.append_lifecycle(session, thread, "thread_updated")
    return ToolResult(status="success", result=RESULT)


def next_turn(
    thread: tables.Thread,
    started_as: str,
    offered: dict[str, types.OfferedTool],
    outcomes: list[types.Outcome],
    verdict: types.Verdict,
) -> types.Verdict:
    """After a step that handed off (a handoff tool, or `state.run_agent` in any of its calls: the thread no longer
    runs `started_as`), the new agent's side A acts next in this run, in a turn of its own (the old turn is not
    counted); only a verdict that ends the session still wins."""
    handed_off = thread.agent != started_as or any(
        o.result.status == "success"
        and (tool := offered.get(o.call["function"]["name"])) is not None
        and tool.kind == "handoff"
        for o in outcomes
    )
    if not handed_off or verdict.ends == "session":
        return verdict
    thread.side = "a"
    thread.turn_steps = 0
    return types.GO_ON
